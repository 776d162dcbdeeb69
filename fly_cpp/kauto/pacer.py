"""k auto's controller of one engine and mode: it asks the planner (``fly_cpp.kauto.planner``, a pure
function) for each round's plan at a draw from its belief (``fly_cpp.kauto.belief``), and teaches the
belief and the costs (``fly_cpp.kauto.costs``) from the rounds. Inside a drafting round it values one
more step, and the prefix worth verifying, at the pace the rounds keep (``fly_cpp.kauto.worth``).

Only warm decodes (of the same kind as the one before) teach the cost scales and the long-run
record of drafting against the target alone: on a GPU the first batch after one-row decodes pays
for a new graph; every speculating round is set beside its forecast, which prices that switch
(``Costs.entering``), for the belief's correction. Under load (``sharing``: several sequences' rounds share each decode,
``fly_cpp.engine.batchloop``) rounds teach acceptance only: their timings are the shared decodes'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fly_cpp.kauto import planner, worth
from fly_cpp.kauto.belief import Belief, Draw
from fly_cpp.kauto.costs import Costs
from fly_cpp.kauto.evidence import Acceptance, Evidence, Guesses, bin_of

# the plans that draft with the draft model
DRAFTS = ("draft", "explore", "steady")


class Pacer:
    """The controller of one engine and mode (it carries over between generations). ``load``
    gives the cost model; it is called on first use, inside a generation."""

    def __init__(self, load: Callable[[], Costs], k_max: int, evidence: Evidence | None = None,
                 steady: bool = False, seed: int = 0) -> None:
        self.load, self.k_max, self.steady = load, k_max, steady
        self.evidence = evidence if evidence is not None else Evidence()
        self.belief = Belief(self.evidence, seed)
        self.rest = 0  # rounds left to decode with the target alone without planning
        self.planned = False  # this round's plan was made (not a round of a rest)
        self.matched = 0  # the length of the n-gram match the planned guess continues
        self.plans = {"target": 0, "ngram": 0, "draft": 0, "explore": 0, "steady": 0}
        self.width: int | None = None  # with ``steady``: the generation's draft length (None: not chosen yet)
        self.sharing = 1  # sequences whose rounds share this round's decodes (set each round under load)
        self._then = False  # the rest under way ends in a round that tries drafting (``planner.Plan.then``)
        self._forecasts: list[float] = []  # the last plan's forecast rates by the tokens verified
        self._exploring = False  # this round explores
        self._drafted = False  # the last round drafted with the draft model
        self._costs: Costs | None = None

    # under load (several slots, ``fly_cpp.engine.batchloop``)
    def share(self, active: int) -> None:
        """``active`` slots share this round's decodes (1: it runs alone)."""
        self.sharing = active

    def together(self, active: int, k_max: int) -> int:
        """The draft length (up to ``k_max``, 0: none) of a round drafted in step with
        ``active`` slots, as priced by the measured costs of their shared batches
        (``worth.together``)."""
        return worth.together(self.costs, self.model.mean(), active, k_max)

    # what has been learned, by name
    @property
    def model(self) -> Acceptance:
        return self.evidence.model

    @property
    def guesses(self) -> Guesses:
        return self.evidence.guesses

    @property
    def agree(self) -> Acceptance:
        return self.evidence.agree

    @property
    def pace(self) -> float:
        return self.belief.pace

    @property
    def costs(self) -> Costs:
        if self._costs is None:
            self._costs = self.load()
        return self._costs

    def alone(self) -> float:
        return worth.alone(self.costs)

    def floor(self) -> float:
        """The pace to beat: what the rounds achieve lately, and at least the target's own."""
        return max(self.pace, self.alone())

    def best(self, accept: float, h_max: int, first: float, step: float,
             lead: Sequence[float] = (), depths: Sequence[float] = ()) -> tuple[float, int]:
        return worth.best(self.costs, accept, h_max, first, step, lead, depths)

    def plan(self, limit: int, lag: Callable[[], int], guess: Callable[[], tuple[int, int]],
             has_draft: bool) -> tuple[str, int]:
        """This round's plan: (kind, tokens), ``fly_cpp.kauto.planner.Plan``'s. ``lag()``: tokens the
        draft model must catch up on; ``guess()``: the length of the n-gram guess and of the
        match it continues (asked unless the round rests)."""
        self.planned = not (limit <= 0 or self.rest > 0)
        if not self.planned:
            self.rest = max(self.rest - 1, 0)
            return self._chose("target", 0)
        width = 0
        if self.steady and has_draft and self.sharing == 1:
            if self.width is None:  # the generation's length: its rounds each catch up on the token after the last
                mean, depths = self.model.mean(), self.evidence.depths
                self.width = self.best(mean, self.k_max, self.costs.draft(2), self.costs.draft(1),
                                       depths=[depths(j, mean) for j in range(1, self.k_max + 1)])[1]
            width = self.width
        n, self.matched = guess()  # looked up also when guesses cannot pay: the round's text judges it
        draw = self.belief.draw(self.matched, self.costs.draft_checked)
        limits = planner.Limits(limit, has_draft, lag() if has_draft else 0, n, self.matched, width, self.sharing > 1,
                                self._then)
        chosen = planner.plan(draw, self.costs, limits)
        self._forecasts = self._forecast(chosen.kind, draw, limits) if chosen.kind != "target" else []
        self._exploring = chosen.kind == "explore"
        self.belief.planned(chosen.kind)
        self.rest, self._then = chosen.rest, chosen.then
        return self._chose(chosen.kind, chosen.n)

    def _forecast(self, kind: str, draw: Draw, limits: planner.Limits) -> list[float]:
        """Tokens per second the model forecasts for this round by the tokens it will verify
        (1, 2, ...): at the mean acceptance (an n-gram guess's: its match length's) and the
        prices now, switching kinds included (``Costs.entering``)."""
        if kind == "ngram":
            accept, first, step = draw.guess, 0.0, 0.0
        else:
            accept, first, step = draw.mean, self.costs.draft(limits.lag + 1), self.costs.draft(1)
        return [rate for _, rate in worth.rates(self.costs, [accept] * limits.limit, first, step, 0, accept)]

    def _chose(self, kind: str, n: int) -> tuple[str, int]:
        self.plans[kind] += 1
        return kind, n

    def begin(self) -> None:
        """A generation starts: a new text. What the rounds taught about the last one says less
        about this one: the acceptance's evidence ages as over a whole text (``Belief.new_text``),
        so where it ended unpredictable the new text is soon tried (on the costly pair a
        predictable answer after one that ended unpredictable was decoded 44 rounds alone)."""
        if self._costs is not None:
            self._costs.cold()  # the prompt's decode comes before the first round
        self.width = None  # a rest under way goes on: it was sampled from a belief no new text can make surer
        self._drafted = False
        self.belief.new_text()

    # inside a round, valued at the pace (``worth.value``)
    def verifies(self, drafted: int) -> int:
        """The fewest drafted tokens this round verifies: an exploration all it drafted (judged at
        the mean, its tokens were trimmed away unverified and taught nothing)."""
        return drafted if self._exploring else 0

    def guess_length(self, available: int, catchup: int) -> int:
        return worth.guess_length(self.costs, self.agree.mean(), available, catchup)

    def more(self, chances: Sequence[float], accept: float) -> bool:
        return worth.more(self.costs, self.floor(), chances, accept, self.k_max)

    def trim(self, chances: Sequence[float]) -> int:
        """How many drafted tokens to verify: the prefix of most value at the pace."""
        return worth.value(self.costs, self.floor(), chances)[1]

    # learning from the rounds
    def probed(self, confidence: float | None) -> None:
        """The draft's confidence in the first token it drafted this round (kept or not)."""
        if confidence is not None:
            self.evidence.firsts.add(bin_of(confidence))

    def taught(self) -> None:
        """A rest's rounds taught the n-gram guesses (``PairDrafter._learn_rest``): where the
        surest of them would now pay, as a planned round weighs them (at their mean), the rest
        ends and the next round is planned. The rest was sampled from what was believed as it
        began; what its rounds taught since is what a draw of that rest could not know."""
        if self.rest and self.best(self.guesses.surest(), self.k_max, 0.0, 0.0)[1]:
            self.rest, self._then = 0, False

    def ran(self, rounds: int) -> None:
        """``rounds`` more rounds of the rest were decoded with the target alone in one run,
        without a plan asked for each (``Draft.alone``): as if ``plan`` had chosen them."""
        self.rest = max(self.rest - rounds, 0)
        self.plans["target"] += rounds
        self.belief.ran(rounds)

    def observe(self, kind: str, confidences: Sequence[float | None], kept: int, emitted: int,
                seconds: float, warm: bool = True, rounds: int = 1) -> None:
        """A verified round: how many drafted tokens were kept, how many tokens it emitted, how
        long it took (drafting and verifying), and whether it was warm (its target decode of
        the same kind as the round before's, ``Costs.observe_target``); ``rounds``: a run of
        that many rounds of the target alone, one token each, all in ``seconds``."""
        drafting = kind in DRAFTS
        alone_here = self.sharing == 1
        self.belief.timed(kind == "target" and warm and alone_here, drafting and self._drafted, drafting)
        self._drafted = drafting
        if drafting:
            self.evidence.drafted(len(confidences), kept)
            self.model.observe(confidences, kept)
        elif kind == "ngram":
            self.guesses.observe(confidences, kept, self.matched)
        if not alone_here:  # a shared decode's timings are not this sequence's: acceptance only
            return
        h = len(confidences)
        if kind != "target" and seconds > 0 and 0 < h <= len(self._forecasts):  # beside its forecast
            self.evidence.realized.add(emitted / self._forecasts[h - 1], seconds, 1.0)
        if seconds > 0:
            self.belief.paced(emitted / seconds, rounds)

    def as_dict(self) -> dict[str, object]:
        return {"plans": dict(self.plans), "acceptance": round(self.model.mean(), 3),
                "ngram_acceptance": round(self.guesses.mean(), 3), "ngram_acceptance_by_match": self.guesses.as_dict(),
                "draft_agrees_with_ngram": round(self.agree.mean(), 3), "tokens_per_second": round(self.pace, 2),
                "costs": self._costs.as_dict() if self._costs is not None else None}

"""k auto's planner: each round, the plan with the most expected tokens per second
(``fly_cpp.worth``, priced by ``fly_cpp.costs``, from what ``fly_cpp.evidence`` has learned):

- ``target``: a plain target decode, no draft call at all;
- ``ngram``: an n-gram guess verified alone (no draft decode);
- ``draft``: drafting with the draft model, weighed at the draft's mean acceptance, and as a
  probe: one step whose token's confidence decides whether to go on (worth it when the draft is
  often sure and right where it is sure, even if its mean acceptance is too low to pay);
- ``explore``: when speculation does not pay now, a try now and then (less often after each
  fruitless one) so that a text turning predictable again is noticed; when even a draft that
  is always right could not pay, none;
- ``steady`` (a target wholly on a GPU, ``steady``): every round of a generation drafts the one
  length the same objective picks for it at its start, from the costs and how often drafted
  tokens were kept by their depth in the round (``Evidence.depths``), as they stand then. There a decode costs more when the batch's shape changes
  (llama.cpp builds a new graph), and rounds planned one by one change it: on an H100 (costly
  pair) planned rounds ran 0.69-0.92x llama.cpp's best fixed k, a fixed k 6 1.15-1.18x
  (docs/benchmarks-log.md, 2026-11-25). Where drafting cannot pay at that acceptance, the
  generation's rounds are planned as anywhere else.

What the drafting rounds realized overrules the models: while they have been slower, all told,
than the target alone, only explorations draft. Only warm rounds (a target decode of the same
kind as the round before's) teach that record: on a GPU the first batch after one-row decodes
pays for a new graph.

Under load (``sharing``: several sequences' rounds share each decode, ``fly_cpp.batchloop``)
rounds teach acceptance only: their timings are the shared decodes', not this sequence's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fly_cpp import worth
from fly_cpp.costs import MEDIAN_OF, Costs
from fly_cpp.decayed import ROUND, Tally, ema
from fly_cpp.evidence import Acceptance, Evidence, Guesses, bin_of

# rounds between explorations at first, and again after a fruitful one (tests/test_pacing.py's
# exploration tests; replays, scripts/replay_sensitivity.py: 2 and 8 within 1.5%)
PATIENCE = 4
# at most this many rounds between explorations when speculation does not pay, and between price
# checks of the target alone (test_pacing: fewer than 40 tries in 2,000 fruitless rounds; replays:
# 128 and 512 within 0.6%)
EXPLORE_MAX = 256
# rounds without planning when no speculation at all can pay (costs are checked again after): a rest
# also looks up no n-gram guesses, whose evidence comes from the guesses looked up (rests of 256
# rounds kept guesses that paid alone on the Q4_K_M shape from being learned in 300 rounds:
# test_drafters' test_guesses_pay_alone_where_the_draft_model_cannot)
REST = 32
# an exploration drafts as far as it would pay if this share of tokens were kept (replays: 0.8 and
# 0.95 lose 1.1% and 2.4% on the fast pair)
OPTIMISM = 0.9
# observations (decayed) before a record speaks: first drafted tokens for a probe, drafting rounds
# to stop drafts (test_pacing: a cold start's few losing rounds; replays: 4 and 16 no change)
SEEN = 8.0
# drafting rounds (decayed) before the long run can say that drafting does not pay here (d421677: a
# fresh process began on an unpredictable text and its ~24 losing rounds stopped drafting for good)
PAIR_SEEN = 32.0


# the plans that draft with the draft model; "check": two rounds that time the draft's steps
# against a cached draft curve no live decode has checked (``plan``), judged as no other plan
DRAFTS = ("draft", "explore", "steady", "check")
# a check drafts this many tokens in each of its two rounds: its second (warm) round's steps are
# the live decodes the curve is checked by
CHECK_TOKENS = MEDIAN_OF + 1


class Pacer:
    """The controller of one engine and mode (it carries over between generations). ``load``
    gives the cost model; it is called on first use, inside a generation."""

    def __init__(self, load: Callable[[], Costs], k_max: int, evidence: Evidence | None = None,
                 steady: bool = False) -> None:
        self.load, self.k_max, self.steady = load, k_max, steady
        self.evidence = evidence if evidence is not None else Evidence()
        self.pace = 0.0  # tokens per second the recent rounds kept (0: none yet)
        self.drafted = Tally(3, 1 - ROUND)  # recent drafting rounds: the target alone's seconds for their tokens, theirs, rounds
        self.idle = 0  # rounds since speculation was last tried
        self.patience = PATIENCE  # rounds to wait before the next exploration
        self.explore_next = False  # an exploration's second round comes next (the first one is not warm)
        self.draft_check_planned = False  # a check of a cached draft curve was planned (once a pacer)
        self.check_next = False  # a check's second round comes next
        self.rest = 0  # rounds left to decode with the target alone without planning (nothing can pay before)
        self.matched = 0  # the length of the n-gram match the planned guess continues
        self.plans = {"target": 0, "ngram": 0, "draft": 0, "explore": 0, "steady": 0, "check": 0}
        self.width: int | None = None  # with ``steady``: the generation's draft length (None: not chosen yet)
        self.sharing = 1  # sequences whose rounds share this round's decodes (set each round under load)
        self.unpriced = 0  # planned rounds since a warm one-row target decode was seen
        self._costs: Costs | None = None

    # under load (several slots, ``fly_cpp.batchloop``)
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
        """This round's plan: ("target", 0), ("ngram", n), ("draft", max tokens) or ("explore",
        n). ``lag()``: tokens the draft model must catch up on; ``guess()``: the length of the
        n-gram guess and of the match it continues (each asked only when needed)."""
        if limit <= 0 or self.rest > 0:
            self.rest = max(self.rest - 1, 0)
            return self._chose("target", 0)
        if self.steady and has_draft and self.sharing == 1:
            if self.width is None:  # the generation's length: its rounds each catch up on the token after the last
                mean, depths = self.model.mean(), self.evidence.depths
                self.width = self.best(mean, self.k_max, self.costs.draft(2), self.costs.draft(1),
                                       depths=[depths(j, mean) for j in range(1, self.k_max + 1)])[1]
            if self.width > 0:
                return self._chose("steady", min(self.width, limit))
        if self.check_next and has_draft:
            self.check_next = False
            return self._chose("check", min(CHECK_TOKENS, limit))
        if self.explore_next and has_draft:  # judged on its second round: see ``observe``
            self.explore_next = False
            return self._explore(limit, self.costs.draft(lag() + 1), self.costs.draft(1))
        if self.unpriced >= EXPLORE_MAX and self.sharing == 1:
            # every plan weighs drafting against the target alone, and while every round drafts the
            # target's one-row decode is never seen: its price is a guess (``Costs.target``). On a
            # machine whose one-row decodes had sped up to 0.70x their cached curve while batches
            # had not, k auto drafted every round at 0.84x the target alone (128 tokens, the F16
            # pair). The target alone is explored then as drafting is while it rests, as often as
            # that at the most, and for two rounds as well (the first one after a batch is not warm)
            self.unpriced, self.rest = 0, 1
            return self._chose("target", 0)
        target_rate = self.alone()
        g_rate, g, g_accept = 0.0, 0, 0.0
        guesses_may_pay = self.best(self.guesses.surest(), limit, 0.0, 0.0)[1] > 0
        # looked up also when guesses cannot pay: what the round then writes tells whether the
        # guess was right (``guess_written``)
        n, self.matched = guess()
        if guesses_may_pay and n:
            g_accept = self.guesses(self.matched)
            g_rate, g = self.best(g_accept, min(n, limit), 0.0, 0.0)
        d_rate = 0.0
        if has_draft:
            behind = lag()
            first, step = self.costs.draft(behind + 1), self.costs.draft(1)
            d_rate = self.best(self.model.mean(), limit, first, step)[0]
            if g:  # the draft's first step checks the guess (``PacedDrafter``), and drafting goes on past it
                chained = self.best(self.model.mean(), limit, self.costs.draft(behind + 1 + g), step, [g_accept] * g)[0]
                d_rate = max(d_rate, chained)
        losing = self.drafts_lose()
        if g_rate > target_rate and (g_rate >= d_rate or losing):
            return self._chose("ngram", g)
        if d_rate > target_rate and not losing:
            return self._chose("draft", limit)
        # could a caught-up draft that is always right pay? What the draft lags by is a debt of
        # the rounds decoded alone, paid once whenever it drafts again, not a price of drafting:
        # priced in here, the debt grew with every round of rest until no try could pay, and a
        # text that turned predictable again was decoded alone to its end (test_pacing, driving
        # the real drafter: 0 drafts in 1,200 rounds of a draft right 95% of the time)
        if has_draft and self.best(1.0, limit, step, step)[1] > 0:
            if not losing and self.probe_pays(limit, first, step):
                return self._chose("draft", limit)
            # drafting could pay if the draft were right more often: try it now and then, as far
            # as it would pay if the draft were right as often as it is at best. When no length
            # would pay even then (caught up), a try could never beat the target alone and would show
            # nothing (one drafted token on a compute-bound target: 2 rows cost 1.6 decodes)
            if self.best(OPTIMISM, limit, step, step)[1] > 0:
                self.idle += 1
                if self.idle >= self.patience:
                    self.explore_next = True
                    return self._explore(limit, first, step)
                if not guesses_may_pay:  # nothing to weigh until the next exploration:
                    self.rest = self.patience - self.idle - 1  # decode alone till then without planning
                    self.idle += self.rest
                return self._chose("target", 0)
        if has_draft and self.sharing == 1 and not self.costs.draft_checked and not self.draft_check_planned:
            # no exploration can pay, by a cached draft curve that no live decode has checked:
            # priced 3x too dear (the F16 pair), no round drafted, so nothing ever corrected it,
            # in any later process. One check a process times the draft's steps against it
            # (``Costs.observe_draft``; where explorations can pay, theirs are timed). A measure,
            # not a try: its rounds teach acceptance and costs but are not judged as drafting
            # rounds (nothing planned them because drafting might pay). The cache then notes the
            # curve checked, so it costs one answer two such rounds once per entry.
            self.draft_check_planned = self.check_next = True
            return self._chose("check", min(CHECK_TOKENS, limit))
        if not guesses_may_pay:  # neither drafting nor guesses (as often right as they are) pay: rest a while
            self.rest = REST
        return self._chose("target", 0)

    def _explore(self, limit: int, first: float, step: float) -> tuple[str, int]:
        """An exploration: as far as drafting would pay if the draft were right as often as it is at best."""
        return self._chose("explore", max(self.best(OPTIMISM, limit, first, step)[1], 1))

    def _chose(self, kind: str, n: int) -> tuple[str, int]:
        self.plans[kind] += 1
        if kind != "target":
            self.idle = 0
        return kind, n

    def begin(self) -> None:
        """A generation starts: a new text. What the last rounds of the previous one said about
        that text (drafting lost there, so explorations came further and further apart) says
        nothing about this one when drafting has paid on this pair over the long run: it is
        forgotten then (on the costly pair a predictable answer after one that ended
        unpredictable was decoded 44 rounds alone before drafting again). Where drafting has
        not paid over a long run, each text starts where the last one ended; a few rounds are
        not a long run (a cold start on an unpredictable text, or on a busy machine, would
        otherwise keep the next texts from drafting: on the F16 pair, 0.95-0.99x the target
        on prompts where fixed k 3 ran 1.3-1.5x)."""
        if self._costs is not None:
            self._costs.cold()  # the prompt's decode comes before the first round, whatever the record says
        self.width = None
        if self.lost_long():
            return
        self.idle = max(self.idle - self.rest, 0)  # a rest counts its rounds as idle in advance
        self.rest, self.patience = 0, PATIENCE
        self.drafted.clear()

    def probe_pays(self, limit: int, first: float, step: float) -> bool:
        """Is one draft step worth its cost for what its token's confidence tells
        (``worth.probe``), once enough first drafted tokens have been seen to say?"""
        firsts = self.evidence.firsts
        if firsts.total() < SEEN:
            return False
        return worth.probe(self.costs, self.floor(), firsts.counts, [self.model.of_bin(b) for b in range(len(firsts.counts))],
                           limit, first, step)

    def drafts_lose(self) -> bool:
        """Have the rounds that drafted with the draft model lately been slower, all told, than
        the target alone? Plans are made from models (of acceptance, of what follows a sure
        first token) that can be wrong in ways they cannot see themselves; what the rounds
        realized cannot. Then only explorations draft, less and less often while they lose too.
        Until the recent rounds are enough to say (a fresh process), the pair's long run says:
        where drafting lost there, a new process does not plan drafts again to learn it anew."""
        recent = self._beat_alone(self.drafted.sums)
        return recent is False or (recent is None and self.lost_long())

    def _beat_alone(self, record: Sequence[float], seen: float = SEEN) -> bool | None:
        """Did the drafting rounds of ``record`` (decayed sums of the seconds the target alone
        would have taken for their tokens, of their own seconds, and of rounds) take less time
        than the target alone would have for what they emitted? None: fewer than ``seen`` rounds
        to say. Each round is priced at its own depth: a decode attends over the whole context,
        so the target alone runs slower late in a long text than early in a short one (the kit's
        ``fast`` pair: 1.1 ms a token at 50 tokens of context, 3.1 ms at 400), and a record of
        tokens and seconds weighed at one depth said that drafting paid where it lost."""
        alone, seconds, rounds = record
        return None if rounds < seen else alone >= seconds

    def lost_long(self) -> bool:
        """Has drafting lost to the target alone over a long run on this pair?"""
        return self._beat_alone(self.evidence.drafted_long.sums, PAIR_SEEN) is False

    # inside a round, valued at the pace (``worth.value``)
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

    def ran(self, rounds: int) -> None:
        """``rounds`` more rounds of the rest were decoded with the target alone in one run,
        without a plan asked for each (``Draft.alone``): as if ``plan`` had chosen them."""
        self.rest = max(self.rest - rounds, 0)
        self.plans["target"] += rounds

    def observe(self, kind: str, confidences: Sequence[float | None], kept: int, emitted: int,
                seconds: float, warm: bool = True, rounds: int = 1) -> None:
        """A verified round: how many drafted tokens were kept, how many tokens it emitted, how
        long it took (drafting and verifying), and whether it was warm (its target decode of
        the same kind as the round before's, ``Costs.observe_target``); ``rounds``: a run of
        that many rounds of the target alone, one token each, all in ``seconds``. Only warm rounds say
        whether drafting pays: the first drafting round after plain ones pays for switching
        (on a GPU a single one lost to the target alone where drafting every round won 1.5x,
        and the record of such rounds kept drafting off for good). So an exploration drafts
        two rounds in a row and the second one is judged."""
        if kind == "target" and warm and self.sharing == 1:
            self.unpriced = 0
        elif kind != "target":
            self.unpriced += 1
        if kind in DRAFTS:
            self.evidence.drafted(len(confidences), kept)
            self.model.observe(confidences, kept)
        elif kind == "ngram":
            self.guesses.observe(confidences, kept, self.matched)
        if self.sharing > 1:  # a shared decode's timings are not this sequence's: acceptance only
            return
        if kind in DRAFTS and kind != "check" and warm:  # the round's time beside what the target alone would have taken for its tokens, here
            alone = emitted / self.alone()
            self.drafted.add(alone, seconds, 1.0)
            self.evidence.drafted_long.add(alone, seconds, 1.0)
            if kind == "explore":  # a try that beat the target alone makes the next one come soon, another one later
                fruitful = 2 * kept >= len(confidences) and alone > seconds
                self.patience = PATIENCE if fruitful else min(self.patience * 2, EXPLORE_MAX)
        if seconds > 0:
            rate = emitted / seconds  # each of a run's rounds as one round of its mean length
            self.pace = rate if self.pace == 0 else ema(self.pace, rate, 1 - (1 - ROUND) ** rounds)

    def as_dict(self) -> dict[str, object]:
        return {"plans": dict(self.plans), "acceptance": round(self.model.mean(), 3),
                "ngram_acceptance": round(self.guesses.mean(), 3), "ngram_acceptance_by_match": self.guesses.as_dict(),
                "draft_agrees_with_ngram": round(self.agree.mean(), 3), "tokens_per_second": round(self.pace, 2),
                "costs": self._costs.as_dict() if self._costs is not None else None}

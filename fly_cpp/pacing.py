"""Cost-aware speculation (``k="auto"``): how many tokens to draft, every round.

A round that drafts h tokens costs the draft steps plus one target decode of h+1 rows, and
emits 1 + (accepted drafted tokens). ``Pacer`` keeps what that means here and now:

- costs: ``fly_cpp.costs`` (measured curves, at the round's depth of context, scaled by real rounds);
- acceptance: ``Acceptance``, the chance that a drafted token is kept given that every earlier
  one in its round was, learned from the rounds (FLy's loose accepts count as kept), by the
  draft's own confidence in the token (its top probability) and on average; n-gram guesses
  have their own, by the length of the n-gram they continue (``Guesses``).

Each round it picks the plan with the most expected tokens per second: a plain target decode
(no draft call at all), an n-gram guess (no draft decode), or drafting with the draft model.
Drafting is weighed twice: at the draft's mean acceptance, and as a probe: one draft step whose
token's confidence then decides whether to go on, verify, or drop it (worth its step when the
draft is often sure and right where it is sure, even if its mean acceptance is too low to pay).
While the draft model drafts, it stops as soon as one more step is expected to add fewer tokens
per second than the pace the rounds have been keeping, and leaves trailing tokens out of the
batch when verifying them costs more than they are worth. When speculation does not pay it
still explores now and then (less often after each fruitless try) so that it notices when the
text turns predictable again; when even a draft that is always right could not pay, it never
drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fly_cpp import ngram
from fly_cpp._llama import common_prefix
from fly_cpp.costs import Costs
from fly_cpp.drafters import Drafter, ModelDrafter

BINS = 10  # confidence bins of the acceptance model
PRIOR = 2.0  # pseudo-observations of the prior in each bin (prior mean: the bin's confidence)
MEMORY = 0.99  # weight of old acceptance evidence per new observation (recent text counts more)
PACE = 0.1  # weight of one round in the running pace (tokens per second)
PATIENCE = 4  # rounds between explorations at first, and again after a fruitful one
EXPLORE_MAX = 256  # at most this many rounds between explorations when speculation does not pay
OPTIMISM = 0.9  # an exploration drafts as far as it would pay if this many tokens were kept
REST = 32  # rounds without planning when no speculation at all can pay (costs are checked again after)
PROBES_SEEN = 8.0  # first drafted tokens seen (decayed) before a probe is weighed by them
PROBE_MEMORY = 0.98  # weight of an old first token's confidence per new one
DRAFTED_MEMORY = 0.9  # weight of an old drafting round in the drafting rounds' realized pace
DRAFTED_SEEN = 8.0  # drafting rounds (decayed) before their realized pace can stop planned drafts
PAIR_MEMORY = 0.995  # ... the same over a long run: has drafting paid on this pair at all?
PAIR_SEEN = 32.0  # drafting rounds (decayed) before the long run can say that drafting does not pay here


def _bin(confidence: float) -> int:
    return min(max(int(confidence * BINS), 0), BINS - 1)


class Acceptance:
    """P(a drafted token is kept | the earlier ones in its round were), overall and by the
    draft's confidence in it."""

    def __init__(self, prior: float = 0.5) -> None:
        self.hits = [0.0] * BINS
        self.trials = [0.0] * BINS
        self.all_hits, self.all_trials, self.prior = 0.0, 0.0, prior

    def mean(self) -> float:
        return (self.all_hits + PRIOR * self.prior) / (self.all_trials + PRIOR)

    def __call__(self, confidence: float | None) -> float:
        return self.mean() if confidence is None else self.of_bin(_bin(confidence))

    def of_bin(self, b: int) -> float:
        return (self.hits[b] + PRIOR * (b + 0.5) / BINS) / (self.trials[b] + PRIOR)

    def observe(self, confidences: Sequence[float | None], kept: int) -> None:
        """One round: the first ``kept`` drafted tokens were kept, the next one (if any) was not."""
        for i, q in enumerate(confidences[: kept + 1]):
            hit = float(i < kept)
            self.all_hits = self.all_hits * MEMORY + hit
            self.all_trials = self.all_trials * MEMORY + 1
            if q is not None:
                b = _bin(q)
                self.hits = [h * MEMORY for h in self.hits]
                self.trials = [t * MEMORY for t in self.trials]
                self.hits[b] += hit
                self.trials[b] += 1


class Guesses:
    """How often n-gram guesses are right: overall, and by the length of the n-gram a guess
    continues (a guess after a 4-token match is right far more often than one after a 1-token
    match: in repeated code the long matches are the surest, while prose's short matches bring
    the overall mean low). A length seen only a few times leans on the overall mean."""

    def __init__(self, prior: float) -> None:
        self.all = Acceptance(prior)
        self.hits: dict[int, float] = {}
        self.trials: dict[int, float] = {}

    def mean(self) -> float:
        return self.all.mean()

    def __call__(self, matched: int) -> float:
        """P(a guessed token is kept | the earlier ones in its round were), for a guess after
        ``matched`` tokens matched (0: not known)."""
        return (self.hits.get(matched, 0.0) + PRIOR * self.all.mean()) / (self.trials.get(matched, 0.0) + PRIOR)

    def surest(self) -> float:
        """The acceptance of the surest match length seen (what a guess may be worth at best)."""
        return max([self(n) for n in self.trials], default=self.mean())

    def observe(self, confidences: Sequence[float | None], kept: int, matched: int = 0) -> None:
        """As ``Acceptance.observe``, for a guess after ``matched`` tokens matched."""
        self.all.observe(confidences, kept)
        if matched <= 0:
            return
        for i in range(min(kept + 1, len(confidences))):
            self.hits[matched] = self.hits.get(matched, 0.0) * MEMORY + float(i < kept)
            self.trials[matched] = self.trials.get(matched, 0.0) * MEMORY + 1

    def as_dict(self) -> dict[int, float]:
        return {n: round(self(n), 3) for n in sorted(self.trials)}


@dataclass
class Pacer:
    """The controller's state for one engine and mode (it carries over between generations).
    ``load`` gives the cost model; it is called on first use, inside a generation."""

    load: Callable[[], Costs]
    k_max: int
    model: Acceptance = field(default_factory=lambda: Acceptance(0.6))
    guesses: Guesses = field(default_factory=lambda: Guesses(0.3))
    agree: Acceptance = field(default_factory=lambda: Acceptance(0.5))  # the draft model's agreement with guesses
    pace: float = 0.0  # tokens per second the recent rounds kept (0: none yet)
    idle: int = 0  # rounds since speculation was last tried
    patience: int = PATIENCE  # rounds to wait before the next exploration
    explore_next: bool = False  # an exploration's second round comes next (the first one is not warm)
    matched: int = 0  # the length of the n-gram match the planned guess continues
    rest: int = 0  # rounds left to decode with the target alone without planning (nothing can pay before)
    firsts: list[float] = field(default_factory=lambda: [0.0] * BINS)  # first drafted tokens by confidence bin (decayed)
    drafted: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # drafting rounds: tokens, seconds, rounds (decayed)
    drafted_long: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # ... over a long run
    plans: dict[str, int] = field(default_factory=lambda: {"target": 0, "ngram": 0, "draft": 0, "explore": 0})
    _costs: Costs | None = None

    @property
    def costs(self) -> Costs:
        if self._costs is None:
            self._costs = self.load()
        return self._costs

    def alone(self) -> float:
        """Tokens per second of a plain target decode (host time included), now."""
        return 1.0 / (self.costs.host + self.costs.target(1))

    def floor(self) -> float:
        """The pace to beat: what the rounds achieve lately, and at least the target's own."""
        return max(self.pace, self.alone())

    def best(self, accept: float, h_max: int, first: float, step: float) -> tuple[float, int]:
        """(tokens per second, h) of the best draft length h <= h_max for a round whose first
        draft step costs ``first`` seconds and later ones ``step``, each token kept with
        probability ``accept`` given the earlier ones were. A batch after one-row decodes also
        pays for switching kinds, there and back (``Costs.entering``), and a recurrent state for
        going back after a rejection (``Costs.rollback``)."""
        costs = self.costs
        host, target, entering = costs.host, costs.target, costs.entering()
        best, best_h, expected, p = self.alone(), 0, 1.0, 1.0
        for h in range(1, h_max + 1):
            p *= accept
            expected += p
            rate = expected / (host + entering + first + (h - 1) * step + target(h + 1) + costs.rollback(h, accept))
            if rate > best:
                best, best_h = rate, h
        return best, best_h

    def plan(self, limit: int, lag: Callable[[], int], guess: Callable[[], tuple[int, int]],
             has_draft: bool) -> tuple[str, int]:
        """This round's plan: ("target", 0), ("ngram", n), ("draft", max tokens) or ("explore",
        n). ``lag()``: tokens the draft model must catch up on; ``guess()``: the length of the
        n-gram guess and of the match it continues (each asked only when needed)."""
        if limit <= 0 or self.rest > 0:
            self.rest = max(self.rest - 1, 0)
            return self._chose("target", 0)
        if self.explore_next and has_draft:  # judged on its second round: see ``observe``
            self.explore_next = False
            return self._explore(limit, self.costs.draft(lag() + 1), self.costs.draft(1))
        target_rate = self.alone()
        g_rate, g = 0.0, 0
        guesses_may_pay = self.best(self.guesses.surest(), limit, 0.0, 0.0)[1] > 0
        # looked up also when guesses cannot pay: what the round then writes tells whether the
        # guess was right (PacedDrafter._learn_guess)
        n, self.matched = guess()
        if guesses_may_pay and n:
            g_rate, g = self.best(self.guesses(self.matched), min(n, limit), 0.0, 0.0)
        d_rate = 0.0
        if has_draft:
            first, step = self.costs.draft(lag() + 1), self.costs.draft(1)
            d_rate = self.best(self.model.mean(), limit, first, step)[0]
        losing = self.drafts_lose()
        if g_rate > target_rate and (g_rate >= d_rate or losing):
            return self._chose("ngram", g)
        if d_rate > target_rate and not losing:
            return self._chose("draft", limit)
        if has_draft and self.best(1.0, limit, first, step)[1] > 0:
            if not losing and self.probe_pays(limit, first, step):
                return self._chose("draft", limit)
            # drafting could pay if the draft were right more often: try it now and then, as far
            # as it would pay if the draft were right as often as it is at best. When no length
            # would pay even then (the draft caught up: what it lags by is a debt of the idle
            # rounds, not of the try), a try could never beat the target alone and would show
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
        if not guesses_may_pay:  # neither drafting nor guesses (as often right as they are) pay: rest a while
            self.rest = REST
        return self._chose("target", 0)

    def _explore(self, limit: int, first: float, step: float) -> tuple[str, int]:
        """An exploration: as far as drafting would pay if the draft were right as often as it is at best."""
        return self._chose("explore", max(self.best(OPTIMISM, limit, first, step)[1], 1))

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
        if self._beat_alone(self.drafted_long, PAIR_SEEN) is False:
            return
        self.idle = max(self.idle - self.rest, 0)  # a rest counts its rounds as idle in advance
        self.rest, self.patience = 0, PATIENCE
        self.drafted = [0.0, 0.0, 0.0]

    def probe_pays(self, limit: int, first: float, step: float) -> bool:
        """Is one draft step worth its cost for what its token's confidence tells? After it the
        round goes on drafting (each token then as likely kept as that one) or decodes plainly,
        whichever is worth more at the recent pace; the confidences the first drafted tokens
        had lately weigh the outcomes."""
        seen = sum(self.firsts)
        if seen < PROBES_SEEN:
            return False
        pace, host, target = self.floor(), self.costs.host, self.costs.target
        plain = 1.0 - pace * (host + target(1))
        worth = 0.0
        for b, weight in enumerate(self.firsts):
            if weight <= 0:
                continue
            accept, best, expected, p = self.model.of_bin(b), plain, 1.0, 1.0
            for h in range(1, limit + 1):
                p *= accept
                expected += p
                best = max(best, expected - pace * (host + (h - 1) * step + target(h + 1)))
            worth += weight * best
        return worth / seen - pace * first > plain

    def drafts_lose(self) -> bool:
        """Have the rounds that drafted with the draft model lately been slower, all told, than
        the target alone? Plans are made from models (of acceptance, of what follows a sure
        first token) that can be wrong in ways they cannot see themselves; what the rounds
        realized cannot. Then only explorations draft, less and less often while they lose too."""
        return self._beat_alone(self.drafted) is False

    def _beat_alone(self, record: Sequence[float], seen: float = DRAFTED_SEEN) -> bool | None:
        """Did the drafting rounds of ``record`` (tokens, seconds, rounds; decayed) emit more
        than the target alone would have in their time? None: fewer than ``seen`` rounds to say."""
        tokens, seconds, rounds = record
        return None if rounds < seen else tokens >= seconds * self.alone()

    def probed(self, confidence: float | None) -> None:
        """The draft's confidence in the first token it drafted this round (kept or not)."""
        if confidence is not None:
            self.firsts = [w * PROBE_MEMORY for w in self.firsts]
            self.firsts[_bin(confidence)] += 1.0

    def _chose(self, kind: str, n: int) -> tuple[str, int]:
        self.plans[kind] += 1
        if kind != "target":
            self.idle = 0
        return kind, n

    def guess_length(self, available: int, catchup: int) -> int:
        """How many tokens of an n-gram guess the draft model should check in its next step:
        a step over 1 + g rows costs more than a plain one and pays only if the draft agrees with
        enough of the guess (its own next token comes either way)."""
        best, best_g, expected, p = 1.0 / self.costs.draft(catchup + 1), 0, 1.0, 1.0
        for g in range(1, available + 1):
            p *= self.agree.mean()
            expected += p
            rate = expected / self.costs.draft(catchup + 1 + g)
            if rate > best:
                best, best_g = rate, g
        return best_g

    def guess_checked(self, found: Sequence[int], checked: int, agree: int, own_next: int) -> None:
        """A draft step checked the first ``checked`` tokens of the n-gram guess ``found`` and
        agreed with the first ``agree``; ``own_next``: the draft's own token after those. Where
        all the checked tokens agreed, that token says for free whether the first unchecked one
        would have: without it, an agreement that the first guesses brought low would never be
        checked again (on the F16 pair a writing prompt's first 7 guesses stopped the checks for
        the next 40 prompts, code included)."""
        told = agree + 1 if agree == checked < len(found) else checked
        self.agree.observe([None] * told, agree + int(told > checked and found[agree] == own_next))

    def guess_written(self, guess: Sequence[int], wrote: Sequence[int], matched: int = 0) -> None:
        """An n-gram guess no round verified (after ``matched`` tokens matched), judged by the
        tokens the round after it wrote."""
        right = common_prefix(list(guess), list(wrote))
        self.guesses.observe([None] * min(right + 1, len(wrote)), right, matched)

    def more(self, chances: Sequence[float], accept: float) -> bool:
        """After drafting ``len(chances)`` tokens (``chances[i]``: the chance that tokens 0..i
        are all kept): would drafting h more (each kept with ``accept``) be worth more than
        stopping now and verifying the best prefix (``trim``)? Values are expected tokens less
        the time still to spend, at the recent pace."""
        pace, drafted, step = self.floor(), len(chances), self.costs.draft(1)
        stop = self._value(chances)[0]
        expected, p = sum(chances), chances[-1] if chances else 1.0
        for h in range(1, self.k_max - drafted + 1):
            p *= accept
            expected += p
            if expected - pace * (h * step + self.costs.target(drafted + 1 + h)) > stop:
                return True
        return False

    def trim(self, chances: Sequence[float]) -> int:
        """How many drafted tokens to verify (the drafting is paid already): the prefix whose
        expected kept tokens, less what verifying it costs at the recent pace, is largest."""
        return self._value(chances)[1]

    def _value(self, chances: Sequence[float]) -> tuple[float, int]:
        pace = self.floor()
        best, best_n, expected = -pace * self.costs.target(1), 0, 0.0
        for n, chance in enumerate(chances, start=1):
            expected += chance
            value = expected - pace * self.costs.target(n + 1)
            if value > best:
                best, best_n = value, n
        return best, best_n

    def observe(self, kind: str, confidences: Sequence[float | None], kept: int, emitted: int,
                seconds: float, warm: bool = True) -> None:
        """A verified round: how many drafted tokens were kept, how many tokens it emitted, how
        long it took (drafting and verifying), and whether it was warm (its target decode of
        the same kind as the round before's, ``Costs.observe_target``). Only warm rounds say
        whether drafting pays: the first drafting round after plain ones pays for switching
        (on a GPU a single one lost to the target alone where drafting every round won 1.5x,
        and the record of such rounds kept drafting off for good). So an exploration drafts
        two rounds in a row and the second one is judged."""
        if kind in ("draft", "explore"):
            self.model.observe(confidences, kept)
            if warm:
                done = (emitted, seconds, 1.0)
                self.drafted = [x * DRAFTED_MEMORY + y for x, y in zip(self.drafted, done)]
                self.drafted_long = [x * PAIR_MEMORY + y for x, y in zip(self.drafted_long, done)]
        if kind == "explore" and warm:  # a try that beat the target alone makes the next one come soon, another one later
            fruitful = 2 * kept >= len(confidences) and emitted > seconds * self.alone()
            self.patience = PATIENCE if fruitful else min(self.patience * 2, EXPLORE_MAX)
        elif kind == "ngram":
            self.guesses.observe(confidences, kept, self.matched)
        if seconds > 0:
            rate = emitted / seconds
            self.pace = rate if self.pace == 0 else (1 - PACE) * self.pace + PACE * rate

    def as_dict(self) -> dict[str, object]:
        return {"plans": dict(self.plans), "acceptance": round(self.model.mean(), 3),
                "ngram_acceptance": round(self.guesses.mean(), 3), "ngram_acceptance_by_match": self.guesses.as_dict(),
                "draft_agrees_with_ngram": round(self.agree.mean(), 3), "tokens_per_second": round(self.pace, 2),
                "costs": self._costs.as_dict() if self._costs is not None else None}


class PacedDrafter:
    """Drafts what the pacer plans each round, with the engine's drafter (the draft model's,
    when there is one) or n-gram lookup. The loop tells it how each round went (``observe``)."""

    def __init__(self, inner: Drafter, pacer: Pacer, ngram_max: int, ngram_tokens: int, use_ngram: bool) -> None:
        """One per generation; the pacer carries over from one to the next."""
        self.inner, self.pacer = inner, pacer
        pacer.begin()
        self.model = inner if isinstance(inner, ModelDrafter) else None
        self.ngram_tokens, self.use_ngram = ngram_tokens, use_ngram
        index = getattr(inner, "index", None)  # the drafter's own, over the same text: indexed once
        self.index = index if isinstance(index, ngram.Index) and index.max_n == ngram_max else ngram.Index(ngram_max)
        self.kind = "target"
        self.confidences: list[float | None] = []
        # a round's draft, where it starts and the token trimming left out with its confidence:
        # whether the target then wrote that token is told by the next round's committed tokens
        self._unverified: tuple[int, list[int], int, float] | None = None
        self._guessed: tuple[int, list[int], int] | None = None  # an n-gram guess the round did not verify, where, its match

    def draft(self, committed: Sequence[int], limit: int) -> list[int]:
        self._learn_left_out(committed)
        self._learn_guess(committed)
        guess: list[int] = []

        def lookup() -> tuple[int, int]:
            matched, found = self.index.match(committed, min(self.ngram_tokens, limit))
            guess.extend(found)
            return len(found), matched

        model = self.model
        self.pacer.costs.at(len(committed))  # what this round's decodes cost depends on the context they attend over
        self.kind, n = self.pacer.plan(limit, lambda: model.lag(committed) if model is not None else 0,
                                       lookup if self.use_ngram else lambda: (0, 0), model is not None)
        if self.kind != "ngram" and guess:
            self._guessed = (len(committed), guess, self.pacer.matched)
        if self.kind == "ngram":
            bias = getattr(self.inner, "bias", None)
            out = bias.cut(guess[:n]) if bias else guess[:n]  # not past a token the logit bias bans
            self.confidences = [None] * len(out)
            return out
        if self.kind in ("draft", "explore") and self.model is not None:
            out = self.model.draft(committed, n, self.pacer if self.kind == "draft" else None, confident=True)
            self.confidences = list(self.model.confidences)
            self.pacer.probed(self.model.first_confidence)
            if self.kind == "draft" and self.model.left_out is not None:
                token, confidence = self.model.left_out
                self._unverified = (len(committed), out, token, confidence)
            return out
        self.confidences = []
        return []

    def _learn_guess(self, committed: Sequence[int]) -> None:
        """An n-gram guess the last round looked up but did not verify is judged by the tokens
        the round wrote, as the target would have judged it: without this, guesses that a few
        misses made not worth verifying would never be tried again (with no draft model, n-gram
        lookup, the only speculation there, would stay off for the rest of the engine's life).
        With a draft model too: the draft checks the guesses it drafts from (``guess_checked``),
        but a guess verified alone, with no draft step, pays where drafting does not (a
        compute-bound target). Weighed by one mean over all guesses this evidence made lone
        guesses win rounds the drafts would have won (replay: 1.68x -> 1.64x the target on the
        F16 pair); by the length of the match they continue (``Guesses``) it does not."""
        if self._guessed is None:
            return
        start, guess, matched = self._guessed
        self._guessed = None
        self.pacer.guess_written(guess, committed[start:start + len(guess)], matched)

    def _learn_left_out(self, committed: Sequence[int]) -> None:
        """A token left out of the last round's batch is evidence too: when every drafted token
        before it was kept, the token the target wrote in its place says whether it would have
        been kept (exactly). Without this, the confidences whose tokens always get trimmed would
        keep their prior forever, right or wrong, and the drafts would stay short."""
        if self._unverified is None:
            return
        start, verified, token, confidence = self._unverified
        self._unverified = None
        end = start + len(verified)
        if len(committed) > end and list(committed[start:end]) == verified:
            self.pacer.model.observe([confidence], int(committed[end] == token))

    def observe(self, kept: int, emitted: int, draft_seconds: float, target_rows: int, target_seconds: float,
                round_seconds: float, decoded_rows: int) -> None:
        """A round: ``target_rows`` verified (the last committed token and the drafts), of the
        ``decoded_rows`` the target decoded (more where the batch was padded, ``fly_cpp.shape``)."""
        costs = self.pacer.costs
        warm = costs.observe_target(decoded_rows, target_seconds)
        costs.draft_warm = self.kind in ("draft", "explore") and self.model is not None
        costs.observe_host(round_seconds - draft_seconds - target_seconds)
        verified = self.confidences[: target_rows - 1]  # a draft may have been dropped (n_min)
        self.pacer.observe(self.kind, verified, kept, emitted, round_seconds, warm)

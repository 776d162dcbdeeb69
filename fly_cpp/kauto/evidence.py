"""What the rounds have taught k auto about a pair: how often drafted tokens are kept.

- ``Acceptance``: P(a drafted token is kept | the earlier ones in its round were), overall and by
  the draft's own confidence in the token (its top probability), FLy's loose accepts counting
  as kept. The same type holds the draft model's agreement with n-gram guesses.
- ``Guesses``: the same for n-gram guesses, by the length of the n-gram a guess continues.
- ``Evidence``: a pair's record as a whole: the rates above, the confidence the first drafted
  tokens had lately, and whether drafting rounds have paid over a long run. It outlives a
  process (``as_dict`` / ``load``: kept next to the calibrated costs, ``fly_cpp.kauto.costcache``).

Every rate is a ``decayed.Rate``: recent text counts more (``MEMORY`` per new observation).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from fly_cpp.backend.cache import common_prefix
from fly_cpp.kauto.decayed import ROUND, Histogram, Rate, Tally

BINS = 10  # confidence bins of the acceptance model (its resolution, not a tuning)
# pseudo-observations of the prior in each bin, prior mean the bin's confidence (replays,
# scripts/replay_sensitivity.py: 1 and 4 move the GPU-shaped fast pair +3.4% and -8.6%, the rest within 2%)
PRIOR = 2.0
# weight of old evidence per new observation, recent text counting more: acceptance, guesses, the first
# drafted tokens' confidences alike (replays: 0.98 loses 7% on
# the GPU-shaped fast pair, 0.995 gains 5% there and loses 0.7% on the F16 pair; the first tokens' own
# 0.98 and the long run's own 0.995 it replaced moved every recording by 0.1% at most, 2026-12-02)
MEMORY = 0.99


def bin_of(confidence: float) -> int:
    return min(max(int(confidence * BINS), 0), BINS - 1)


class Acceptance:
    """P(a drafted token is kept | the earlier ones in its round were), overall and by the
    draft's confidence in it (bins of width 1/BINS, each with its confidence as prior mean);
    ``prior``: the overall rate's prior mean, even odds where nothing is known."""

    def __init__(self, prior: float = 0.5) -> None:
        self.prior = prior
        self.all = Rate(PRIOR * prior, PRIOR, MEMORY)
        self.bins = [Rate(PRIOR * (b + 0.5) / BINS, PRIOR, MEMORY) for b in range(BINS)]

    def mean(self) -> float:
        return self.all()

    def __call__(self, confidence: float | None) -> float:
        return self.mean() if confidence is None else self.of_bin(bin_of(confidence))

    def of_bin(self, b: int) -> float:
        return self.bins[b]()

    @property
    def hits(self) -> list[float]:
        return [r.hits for r in self.bins]

    @property
    def trials(self) -> list[float]:
        return [r.trials for r in self.bins]

    @property
    def all_hits(self) -> float:
        return self.all.hits

    @property
    def all_trials(self) -> float:
        return self.all.trials

    def observe(self, confidences: Sequence[float | None], kept: int) -> None:
        """One round: the first ``kept`` drafted tokens were kept, the next one (if any) was not."""
        for i, q in enumerate(confidences[: kept + 1]):
            hit = float(i < kept)
            self.all.observe(hit)
            if q is not None:
                b = bin_of(q)
                for rate in self.bins:
                    rate.decay()
                self.bins[b].hits += hit
                self.bins[b].trials += 1

    def state(self) -> list[list[float]]:
        return [self.all.state(), *(r.state() for r in self.bins)]

    def load(self, state: Sequence[Sequence[float]]) -> None:
        for rate, s in zip([self.all, *self.bins], state, strict=True):
            rate.load(s)


class ByKey:
    """Success rates by a key (a match's length, a draft token's depth in its round), each
    leaning on a mean it is given where its key has been seen little (``PRIOR`` pseudo-observations
    of that mean)."""

    def __init__(self) -> None:
        self.rates: dict[int, Rate] = {}

    def __call__(self, key: int, mean: float) -> float:
        rate = self.rates.get(key)
        hits, trials = (rate.hits, rate.trials) if rate is not None else (0.0, 0.0)
        return (hits + PRIOR * mean) / (trials + PRIOR)

    def observe(self, key: int, hit: float) -> None:
        self.rates.setdefault(key, Rate(0.0, 0.0, MEMORY)).observe(hit)

    @property
    def trials(self) -> dict[int, float]:
        return {n: r.trials for n, r in self.rates.items()}

    def state(self) -> dict[str, list[float]]:
        return {str(n): r.state() for n, r in self.rates.items()}

    def load(self, state: dict[str, Any]) -> None:
        self.rates = {}
        for n, s in state.items():
            self.rates[int(n)] = rate = Rate(0.0, 0.0, MEMORY)
            rate.load(s)


class Guesses:
    """How often n-gram guesses are right: overall, and by the length of the n-gram a guess
    continues (a guess after a 4-token match is right far more often than one after a 1-token
    match: in repeated code the long matches are the surest, while prose's short matches bring
    the overall mean low). A length seen only a few times leans on the overall mean."""

    def __init__(self, prior: float) -> None:
        self.all = Acceptance(prior)
        self.by_length = ByKey()

    def mean(self) -> float:
        return self.all.mean()

    def __call__(self, matched: int) -> float:
        """P(a guessed token is kept | the earlier ones in its round were), for a guess after
        ``matched`` tokens matched (0: not known)."""
        return self.by_length(matched, self.all.mean())

    @property
    def trials(self) -> dict[int, float]:
        return self.by_length.trials

    def surest(self) -> float:
        """The acceptance of the surest match length seen (what a guess may be worth at best)."""
        return max([self(n) for n in self.by_length.rates], default=self.mean())

    def observe(self, confidences: Sequence[float | None], kept: int, matched: int = 0) -> None:
        """As ``Acceptance.observe``, for a guess after ``matched`` tokens matched."""
        self.all.observe(confidences, kept)
        if matched <= 0:
            return
        for i in range(min(kept + 1, len(confidences))):
            # a length's prior is the overall mean, when asked (``__call__``)
            self.by_length.observe(matched, float(i < kept))

    def judged(self, rows: Iterable[tuple[int, bool]]) -> None:
        """One-token guesses, each judged by the token written: (the length of the match it
        continues, whether it was that token), as ``observe`` of each (a rest's hundreds of
        positions at a fraction of its cost)."""
        overall, by_length = self.all.all, self.by_length
        for matched, right in rows:
            overall.observe(float(right))
            by_length.observe(matched, float(right))

    def as_dict(self) -> dict[int, float]:
        return {n: round(self(n), 3) for n in sorted(self.by_length.rates)}

    def state(self) -> dict[str, Any]:
        return {"all": self.all.state(), "by_length": self.by_length.state()}

    def load(self, state: dict[str, Any]) -> None:
        self.all.load(state["all"])
        self.by_length.load(state["by_length"])


class Evidence:
    """A pair's record, as k auto has learned it (it carries over between generations, and
    across processes through the cost cache)."""

    def __init__(self) -> None:
        self.model = Acceptance(0.6)  # drafted tokens kept, by the draft's confidence
        self.guesses = Guesses(0.3)  # n-gram guesses kept, by the length of their match
        # the draft model's agreement with the guesses it checks, even odds before any is seen
        # (not a tuning: replays with priors of 0.25 and 0.75 ran within 0.3%)
        self.agree = Acceptance()
        self.firsts = Histogram(BINS, MEMORY)  # first drafted tokens of rounds, by confidence bin
        # drafted tokens kept by their depth in the round (1: the first), each depth leaning on the
        # mean: where the draft agrees in long runs, deep tokens are kept more often than the mean
        # says (steady rounds' length, ``Pacer.steady``)
        self.depths = ByKey()
        # speculating rounds of late: the seconds their forecasts gave their tokens, their own seconds,
        # rounds (``fly_cpp.kauto.belief``'s correction; a process's own: the prices it forecast by are too)
        self.realized = Tally(3, 1 - ROUND)

    def guess_checked(self, found: Sequence[int], checked: int, agree: int, own_next: int) -> None:
        """A draft step checked the first ``checked`` tokens of the n-gram guess ``found`` and
        agreed with the first ``agree``; ``own_next``: the draft's own token after those. Where
        all the checked tokens agreed, that token says for free whether the first unchecked one
        would have: without it, an agreement that the first guesses brought low would never be
        checked again (on the F16 pair a writing prompt's first 7 guesses stopped the checks for
        the next 40 prompts, code included)."""
        told = agree + 1 if agree == checked < len(found) else checked
        self.agree.observe([None] * told, agree + int(told > checked and found[agree] == own_next))

    def drafted(self, verified: int, kept: int) -> None:
        """A round's drafted tokens by depth: of ``verified``, the first ``kept`` were kept."""
        for depth in range(1, min(kept + 1, verified) + 1):
            self.depths.observe(depth, float(depth <= kept))

    def guess_written(self, guess: Sequence[int], wrote: Sequence[int], matched: int = 0) -> None:
        """An n-gram guess no round verified (after ``matched`` tokens matched), judged by the
        tokens the round after it wrote."""
        right = common_prefix(list(guess), list(wrote))
        self.guesses.observe([None] * min(right + 1, len(wrote)), right, matched)

    def as_dict(self) -> dict[str, Any]:
        """Everything learned, as plain numbers (``load`` takes it back)."""
        return {"model": self.model.state(), "guesses": self.guesses.state(), "agree": self.agree.state(),
                "firsts": list(self.firsts.counts), "depths": self.depths.state()}

    def load(self, state: dict[str, Any]) -> None:
        """Take back what ``as_dict`` gave (a malformed record raises ValueError, KeyError or TypeError)."""
        self.model.load(state["model"])
        self.guesses.load(state["guesses"])
        self.agree.load(state["agree"])
        self.firsts.counts = [float(x) for x in state["firsts"]][:BINS]
        self.depths.load(state.get("depths", {}))  # absent in records kept before 2026-11-29
        if len(self.firsts.counts) != BINS:
            raise ValueError("malformed evidence")

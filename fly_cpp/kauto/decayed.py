"""Statistics that forget: what k auto learns from the rounds (``fly_cpp.kauto.evidence``) and the
running scales of the cost model (``fly_cpp.kauto.costs``) weigh recent observations more.

Two shapes, each written once: ``ema`` (a running mean, one observation weighing ``weight``)
and decayed sums (``Rate``, ``Tally``, ``Histogram``: every old observation counts ``memory``
times what it did before the new one).
"""

from __future__ import annotations

from collections.abc import Sequence

# the weight of one round in k auto's running means (its pace, the cost model's scales), and so
# 1 - ROUND that of an old round in its recent record of drafting: about the last ten rounds count
# (replays, scripts/replay_sensitivity.py: 0.05 and 0.2 move every recording by 2.2% at most)
ROUND = 0.1


def ema(old: float, new: float, weight: float) -> float:
    """A running mean after one observation of weight ``weight``."""
    return (1 - weight) * old + weight * new


class Rate:
    """A success rate with a prior, from decayed counts: (hits + prior hits) / (trials + prior
    trials), the mean of a Beta whose prior is worth ``prior_trials`` observations."""

    __slots__ = ("hits", "trials", "prior_hits", "prior_trials", "memory")

    def __init__(self, prior_hits: float, prior_trials: float, memory: float) -> None:
        self.hits = self.trials = 0.0
        self.prior_hits, self.prior_trials, self.memory = prior_hits, prior_trials, memory

    def __call__(self) -> float:
        return (self.hits + self.prior_hits) / (self.trials + self.prior_trials)

    def observe(self, hit: float) -> None:
        self.hits = self.hits * self.memory + hit
        self.trials = self.trials * self.memory + 1

    def decay(self) -> None:
        """Time passes for this rate while another one of its family is observed."""
        self.hits *= self.memory
        self.trials *= self.memory

    def state(self) -> list[float]:
        return [self.hits, self.trials]

    def load(self, state: Sequence[float]) -> None:
        self.hits, self.trials = float(state[0]), float(state[1])


class Tally:
    """Decayed sums of a few quantities observed together (e.g. tokens, seconds, rounds)."""

    __slots__ = ("sums", "memory")

    def __init__(self, size: int, memory: float) -> None:
        self.sums, self.memory = [0.0] * size, memory

    def add(self, *values: float) -> None:
        self.sums = [x * self.memory + y for x, y in zip(self.sums, values)]

    def clear(self) -> None:
        self.sums = [0.0] * len(self.sums)


class Histogram:
    """Decayed counts by bin."""

    __slots__ = ("counts", "memory")

    def __init__(self, bins: int, memory: float) -> None:
        self.counts, self.memory = [0.0] * bins, memory

    def add(self, bin: int) -> None:
        self.counts = [w * self.memory for w in self.counts]
        self.counts[bin] += 1.0

    def total(self) -> float:
        return sum(self.counts)

"""What k auto believes about a pair now, and one draw from it a round (Thompson sampling).

The belief is the evidence the rounds taught (``fly_cpp.kauto.evidence``: acceptance by the draft's
confidence, n-gram guesses by match length), how old each part is, the pace the rounds keep,
and how the drafting rounds ran against their forecasts. ``Belief.draw`` samples the quantities
a plan turns on from their posteriors:

- the draft's acceptance, from its Beta posterior (by its mean and spread), its evidence aging
  with the rounds since drafted tokens were last verified: what a text lets a draft keep changes
  as the text goes on (code, then prose, then code again), so each such round weighs the
  evidence by ``AGE`` more and the posterior widens back towards the prior. A text that turns
  predictable again is tried again, thin evidence sooner than ample evidence that drafting
  loses, and a try that lost pushes the next one further off;
- an n-gram guess's acceptance after its match length, from its posterior;
- the target's one-row price, off its learned curve by a log-normal factor whose spread grows
  with the rounds since a warm one-row decode was timed (``PRICE_SPREAD``: rounds that all draft
  never show it), and the draft's price, by a wide one while its curve is a cached or prior one
  no live decode has checked (``UNCHECKED_SPREAD``). A price draw that made a plan is held until that plan's decode is
  timed warm (the first decode after the other kind is not), so a try lasts the two rounds it
  needs to teach the price.

The correction is not drawn: drafting rounds' realized rate over their forecast (at the mean
acceptance, the plan's own length), decayed, leaning on 1.0 while few rounds are seen. Plans are
made from a model of acceptance that can be wrong in ways it cannot see itself (the draft's
confidence says little on one text, a lot on another); what the rounds realized corrects it.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fly_cpp.kauto.costs import PRICE_SPREAD
from fly_cpp.kauto.decayed import ROUND, ema
from fly_cpp.kauto.evidence import BINS, MEMORY, PRIOR, Evidence

# the log-spread of a cached or prior draft curve no live decode has checked (one cached 3x too
# dear on the F16 pair had every later process draft nothing)
UNCHECKED_SPREAD = 2.0
# the weight the draft's acceptance evidence keeps per round in which no drafted token is verified:
# as per new observation (``evidence.MEMORY``; replays, AGE 0.9-0.995: within 0.5% of each other)
AGE = MEMORY
# speculating rounds' forecast record leans on pseudo-rounds that ran as forecast, as many as the
# acceptance's prior has pseudo-observations (a cold start's few losing rounds are not enough to
# stop drafting; replays: 4 and 8 within 0.3%)
CORRECTION_PRIOR = PRIOR


@dataclass(frozen=True)
class Draw:
    """One round's sample of the belief: what ``fly_cpp.kauto.planner.plan`` plans at."""

    accept: float  # the draft's acceptance, drawn
    mean: float  # its posterior mean
    guess: float  # the acceptance of the n-gram guess found (its match length's)
    surest: float  # the acceptance of the surest match length seen
    alone_factor: float  # the target alone's rate over its learned one, drawn
    draft_factor: float  # the draft's prices over its learned ones, drawn
    correction: float  # speculating rounds' realized rate over their forecasts (``_correction``)
    pace: float  # tokens per second the recent rounds kept
    firsts: tuple[float, ...]  # the confidences of the first drafted tokens lately, by bin (decayed counts)
    by_bin: tuple[float, ...]  # acceptance by confidence bin
    firsts_seen: bool  # enough first tokens to say what a probe is worth
    hits: float  # the draft's acceptance evidence, as aged now (decayed counts)
    trials: float
    prior: float  # its prior mean: the pair's
    spread: float  # the draft price's log-spread now
    u: float  # a uniform draw: how long the target alone rests (``fly_cpp.kauto.planner``)
    record: tuple[float, float, float]  # speculating rounds against their forecasts, as aged now

    def aged(self, most: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The draft's acceptance, its mean and standard deviation, and the correction, after each
        of 1 .. ``most`` - 1 more rounds without drafting: their evidence aged by ``AGE`` a
        round, as arrays."""
        s = _ages(most)
        mean, variance = _posterior(self.hits * s, self.trials * s, self.prior)
        return mean, np.sqrt(variance), np.broadcast_to(_correction(self.record, s), s.shape)


@functools.cache
def _ages(most: int) -> np.ndarray:
    """AGE ** r for r = 1 .. most - 1 (as Python's power computes each)."""
    return np.array([AGE ** r for r in range(1, most)])


def _correction(record: Sequence[float], s: float = 1.0) -> float:
    """Speculating rounds' realized rate over their forecasts, their record (the seconds the
    forecasts gave their tokens, their own seconds, rounds) weighed by ``s``, leaning on 1.0 by
    CORRECTION_PRIOR rounds."""
    forecast, seconds, rounds = record
    if rounds <= 0 or seconds <= 0:
        return 1.0  # (``s`` may be an array: ``Draw.aged``)
    mean = seconds / rounds  # a pseudo-round: a mean round that ran as forecast
    return (s * forecast + CORRECTION_PRIOR * mean) / (s * seconds + CORRECTION_PRIOR * mean)


def _posterior(hits: float, trials: float, prior: float) -> tuple[float, float]:
    """(mean, variance) of a Beta with ``PRIOR`` pseudo-observations of ``prior``."""
    mean = (hits + PRIOR * prior) / (trials + PRIOR)
    return mean, np.maximum(mean * (1 - mean), 0.0) / (trials + PRIOR + 1)  # (scalars, or arrays: ``Draw.aged``)


def above(x: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """The chance that a normal draw of ``mean`` and ``sd`` exceeds ``x``, elementwise: erf by
    Abramowitz and Stegun 7.1.26 (within 1.5e-7; numpy has none, and ``math.erf`` mapped over a
    rest's rounds took a planned round 0.2 ms: the recordings replay the same)."""
    z = (x - mean) / (np.maximum(sd, 1e-9) * math.sqrt(2))
    a = np.abs(z)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    return 0.5 * (1 - np.sign(z) * (1.0 - poly * np.exp(-a * a)))


def _optimistic(hits: float, trials: float, prior: float, z: float) -> float:
    mean, variance = _posterior(hits, trials, prior)
    return min(max(mean + z * math.sqrt(variance), 0.0), 1.0)


class Belief:
    """The belief of one pacer (it carries over between generations)."""

    def __init__(self, evidence: Evidence, seed: int = 0) -> None:
        self.evidence = evidence
        self.rng = random.Random(seed)
        self.pace = 0.0  # tokens per second the recent rounds kept (0: none yet)
        self.idle = 0  # planned rounds since drafted tokens were last verified
        self._taught_at = evidence.model.all.trials  # the acceptance's count as this text began
        self.unpriced = 0  # rounds since a warm one-row target decode was timed
        self._held: dict[str, float] = {}  # price draws held until their plan's decode is timed warm

    def draw(self, matched: int, draft_checked: bool) -> Draw:
        """This round's draw; ``matched``: the length of the match the round's guess continues.
        The first drafted tokens' confidences say what a probe is worth once they number as many
        (decayed) as their histogram has bins (replays: 4 or 16 of them no change, 2026-12-02)."""
        rng, ev = self.rng, self.evidence
        z = self._held.get("accept", rng.gauss(0.0, 1.0))
        s = AGE ** self.idle
        rate = ev.model.all  # the evidence thins while nothing drafts, back towards the prior
        hits, trials = rate.hits * s, rate.trials * s
        accept = _optimistic(hits, trials, ev.model.prior, z)
        # guesses at their means: every lookup teaches them for free (``Evidence.guess_written``),
        # so trying one teaches nothing a lookup does not; their draw only times a rest's lookups
        guesses = ev.guesses
        target_spread = PRICE_SPREAD * math.sqrt(1 - MEMORY ** self.unpriced)
        spread = 0.0 if draft_checked else UNCHECKED_SPREAD  # a checked draft price is learned whenever it drafts
        zt = self._held.get("target", rng.gauss(0.0, 1.0))
        zd = self._held.get("draft", rng.gauss(0.0, 1.0))
        self._drawn = (z, zt, zd)
        record = (ev.realized.sums[0] * s, ev.realized.sums[1] * s, ev.realized.sums[2] * s)  # aged as the acceptance
        return Draw(accept, ev.model.mean(), guesses(matched), guesses.surest(), math.exp(zt * target_spread),
                    math.exp(zd * spread), _correction(record), self.pace, tuple(ev.firsts.counts),
                    tuple(ev.model.of_bin(b) for b in range(len(ev.firsts.counts))),
                    ev.firsts.total() >= BINS, hits, trials, ev.model.prior, spread, rng.random(),
                    record)

    def correction(self) -> float:
        """Speculating rounds' realized rate over their forecasts (``_correction``); the record
        ages as the acceptance's does while nothing drafts (a losing streak corrected so far down
        that no try could pay once stopped drafting for good)."""
        return _correction(self.evidence.realized.sums, AGE ** self.idle)

    def planned(self, kind: str) -> None:
        """The plan made from the last draw: a try of the target alone holds its price draw, and
        an exploration its draws of the draft, until their decodes are timed warm."""
        z, zt, zd = self._drawn
        self._held = {"target": zt} if kind == "target" else {"accept": z, "draft": zd} if kind == "explore" else {}

    def timed(self, target_warm_one_row: bool, draft_warm: bool, drafted: bool) -> None:
        """A round's decodes: a warm one-row target decode renews its price; drafted tokens
        verified renew the draft's evidence."""
        if target_warm_one_row:
            self.unpriced = 0
            self._held.pop("target", None)
        else:
            self.unpriced += 1
        if draft_warm:
            self._held.pop("draft", None)
            self._held.pop("accept", None)
        self.idle = 0 if drafted else self.idle + 1

    def paced(self, rate: float, rounds: int = 1) -> None:
        """``rounds`` rounds kept ``rate`` tokens per second (each of a run's as one of its mean length)."""
        self.pace = rate if self.pace == 0 else ema(self.pace, rate, 1 - (1 - ROUND) ** rounds)

    def new_text(self) -> None:
        """A new text begins: its acceptance is known only as the pair's, so what the text that
        ended taught of it ages as over the rounds the evidence remembers (1 / (1 - AGE)): its
        counts thin, and its mean moves towards the prior's. A text in which no drafted token was
        verified taught nothing to age: where answers are short and few of their rounds draft
        (the bundled pair under ``serve``), thinning at every text left no evidence, and every
        round's draw was the prior's (1 to 2,776 explorations in 192 answers, 0.46x-1.0x)."""
        rate = self.evidence.model.all
        if rate.trials != self._taught_at:
            keep = AGE ** round(1 / (1 - AGE))
            rate.hits *= keep
            rate.trials *= keep
        self._taught_at = rate.trials

    def ran(self, rounds: int) -> None:
        """``rounds`` more rounds decoded with the target alone, unplanned."""
        self.idle += rounds


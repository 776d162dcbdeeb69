"""What a forward pass costs on this machine, as k auto prices it.

A round pays for drafting (a draft decode a step, plus the rows it catches up on) and for one
target decode of the drafted rows plus one; whether that beats a plain target decode depends on
the machine, the models, their quantization, the threads and the offload. ``Curve``: seconds by
rows, linear in between, and linear in the cache's depth (the synthetic costly target's 17 rows
take 92 ms at 8 tokens of context and 207 ms at 250), from the GGUF headers' prior
(``fly_cpp.kauto.prior``), the cache, or ``fly_cpp.kauto.calibrate``. ``Costs`` scales the curves
by what real rounds take (``observe_*``: a busy machine, a GPU, a throttled CPU alike), a plain
one-row target decode and a batch apart (a one-row decode measured 26% fast made every batch look
35% dear, and drafting stopped where it paid). A curve whose batches cost far more per row than
single decodes (``Curve.plausible``) was bent by other work while it was measured.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fly_cpp.kauto.costcache import LARGEST_TIMED, MEDIAN_OF
from fly_cpp.kauto.decayed import ROUND, ema
from fly_cpp.kauto.rollback_costs import Rollbacks

# a decode on a shallower cache than measured costs at least this share of it (b77ce9f: the costly
# target's 17 rows took 92 ms at 8 tokens of context, 207 ms at 250; replays: 0.125 no change, 0.5 +1.5% fast)
MIN_SHALLOW = 0.25
_TABLE_ROWS = 2 * LARGEST_TIMED  # curve values kept ready for batches up to this many rows
# the log-spread of a price learned long ago: what a machine's speed may have drifted since (one-row
# decodes ran 0.70x their cached curve: docs/k-auto.md); the belief draws the target's price within it
PRICE_SPREAD = 0.15
# how far a price may be off what was expected and still be believed, three spreads either way (1.57x):
# a cached curve off by more is rescaled at once (073c613); a batch of n rows costs at most this times n
# one-row decodes (``MAX_PER_ROW``; 2-row Q4_K_M on a CPU: 2.02; replays: 1.25 and 2 no change)
CHECK_TOLERANCE = math.exp(3 * PRICE_SPREAD)
MAX_PER_ROW = CHECK_TOLERANCE


@dataclass(frozen=True)
class Curve:
    """Seconds of one llama_decode by number of rows, with ``depth`` tokens in the cache:
    measured at ``rows``, linear between them and beyond the last two. ``per_token``: what each
    further token of context adds to a decode of ``rows[i]`` rows (empty: depth is ignored)."""

    rows: tuple[int, ...]
    seconds: tuple[float, ...]
    depth: int = 0
    per_token: tuple[float, ...] = ()

    @functools.cached_property
    def _table(self) -> tuple[float, ...]:
        """Seconds for 0.._TABLE_ROWS rows at ``depth``: the pacer asks for these every round."""
        return tuple(_interpolate(self.rows, self.seconds, n) for n in range(_TABLE_ROWS + 1))

    @functools.cached_property
    def _slopes(self) -> tuple[float, ...]:
        return tuple(_interpolate(self.rows, self.per_token, n) if self.per_token else 0.0
                     for n in range(_TABLE_ROWS + 1))

    def __call__(self, n: int, depth: int | None = None) -> float:
        """Seconds of a decode of ``n`` rows after ``depth`` tokens (None: at the measured depth)."""
        if 0 <= n <= _TABLE_ROWS:
            base, slope = self._table[n], self._slopes[n]
        else:
            base = _interpolate(self.rows, self.seconds, n)
            slope = _interpolate(self.rows, self.per_token, n) if self.per_token else 0.0
        if depth is None or not slope:
            return base
        return max(base + slope * (depth - self.depth), base * MIN_SHALLOW)

    def as_dict(self) -> dict[str, float]:
        return {str(r): round(s * 1e3, 3) for r, s in zip(self.rows, self.seconds)}

    @property
    def plausible(self) -> bool:
        """No batch costs much more per row than one-row decodes do (rows decoded together
        never cost more than decoded apart, up to cache effects): a curve that breaks this was
        bent by other work on the machine while it was measured."""
        return all(s <= self._ceiling(r) for r, s in zip(self.rows, self.seconds))

    def bounded(self) -> Curve:
        """This curve with every size held to the bound ``plausible`` checks."""
        return dataclasses.replace(self, seconds=tuple(min(s, self._ceiling(r)) for r, s in zip(self.rows, self.seconds)))

    def scaled(self, one: float, batch: float) -> Curve:
        """This curve with its one-row decode ``one`` times as dear and its batches ``batch`` times
        (the depth slopes alike, so that it prices every depth as the scaled decodes did); a
        batch never below a one-row decode."""
        factors = [one if r <= 1 else batch for r in self.rows]
        seconds = tuple(itertools.accumulate((s * f for s, f in zip(self.seconds, factors)), max))
        return dataclasses.replace(self, seconds=seconds, per_token=tuple(p * f for p, f in zip(self.per_token, factors)))

    def _ceiling(self, rows: int) -> float:
        """The most a plausible decode of ``rows`` rows costs, from this curve's one-row cost."""
        return MAX_PER_ROW * rows * self.seconds[0]


def _interpolate(rows: Sequence[int], values: Sequence[float], n: int) -> float:
    """``values`` (measured at ``rows``) at ``n`` rows: linear between and beyond the last two,
    proportional below the first."""
    if n <= rows[0] or len(rows) == 1:
        return values[0] * max(n, 0) / rows[0] if n < rows[0] else values[0]
    for i in range(1, len(rows)):
        if n <= rows[i] or i == len(rows) - 1:
            lo, hi = rows[i - 1], rows[i]
            return values[i - 1] + (values[i] - values[i - 1]) * (n - lo) / (hi - lo)
    raise AssertionError("unreachable")


class Costs:
    """The cost model of one pair: calibrated curves, at the depth the caches have now
    (``at``), times running scales (the target's: one for a plain one-row decode, one for
    batches, each following the other until a decode of its own kind is seen)."""

    def __init__(self, target: Curve, draft: Curve | None, *, cached: bool = False,
                 rollbacks: Rollbacks | None = None, measured: str = "", draft_checked: bool = False,
                 scales: tuple[float, float | None, float] = (1.0, None, 1.0), prior: bool = False) -> None:
        """``scales``: the running scales to start from (the target's one-row decodes, its batches
        (None: none seen yet), the draft's), as a record of another run's (``from_dict``) left them.
        ``prior``: the curves are ``fly_cpp.kauto.prior``'s, made from the models' headers, not timed:
        the first warm live decodes of each kind set its scale whatever they say (a cached
        curve's only where it is off by more than CHECK_TOLERANCE), and the curves as those
        decodes priced them are cached when the generation ends (``disagrees``)."""
        self.target_curve, self.draft_curve = target, draft
        self.cached = cached or prior  # the curves came from the cache (or the prior), not from a measurement now
        self.draft_cached = self.cached  # so did the draft's (kept when the curves are cached again: that checks nothing)
        self.prior = prior
        self.draft_trusted = draft_checked  # the cached draft curve was checked by an earlier process's live decodes
        self.measured = measured  # when and under what load the curves were measured ("" unknown)
        self.rollbacks = rollbacks  # recurrent/hybrid caches: what going back costs (None: KV caches, free)
        self.target_scale, self.draft_scale = scales[0], scales[2]
        self.batch_scale: float | None = scales[1]  # target batches (2+ rows); None: none seen yet
        self.host = 0.0  # seconds a round spends outside the decodes (verifying, emitting), lately
        self.planning = 0.0  # seconds a planned round spends planning and looking up, lately (a rest's rounds do not)
        self.switch = 0.0  # seconds a target decode of the other kind than the last costs over a warm one, lately
        self.depth = 0  # tokens in the caches this round (both models hold about as many)
        self._priced_at: tuple[object, ...] = ()  # the state ``_prices`` were found at (``target``)
        self._prices: dict[int, float] = {}
        self._batched: bool | None = None  # the target's last decode had 2+ rows (None: not since ``cold``)
        self._draft_warm = False  # the draft model decoded last round or earlier in this one (its decodes now teach)
        self._checks: dict[bool, list[float]] = {False: [], True: []}  # a cached curve's first live ratios, by kind
        self._draft_checks: list[float] = []  # the cached draft curve's first live ratios
        self._seen = {False: False, True: False}  # a warm decode of each kind (one row, a batch) was seen
        self._guessed: list[float] | None = None  # the one-row scale followed the batches: its first own ratios
        self.disagrees = False  # the live decodes contradicted the cached curve: it is to be cached rescaled

    def cold(self) -> None:
        """A decode outside the rounds (a prompt) came last: the next round's decodes are not warm."""
        self._batched, self._draft_warm = None, False

    def at(self, depth: int) -> None:
        """This round's decodes come after ``depth`` tokens of context."""
        self.depth = depth

    def target(self, rows: int) -> float:
        """Seconds of one target decode of ``rows`` rows, now: kept until the depth, the scales or
        the curve move (a plan asks for the same few ~100 times: 0.15 ms a planned round)."""
        state = (self.depth, self.target_scale, self.batch_scale, self.target_curve)
        if state != self._priced_at:
            self._priced_at, self._prices = state, {}
        price = self._prices.get(rows)
        if price is None:
            scale = self.target_scale if rows <= 1 or self.batch_scale is None else self.batch_scale
            price = self._prices[rows] = self.target_curve(rows, self.depth) * scale
        return price

    def draft(self, rows: int) -> float:
        """Seconds of one draft decode of ``rows`` rows, now (0 without a draft model)."""
        return self.draft_curve(rows, self.depth) * self.draft_scale if self.draft_curve is not None else 0.0

    def rollback(self, h: int, accept: float) -> float:
        """Seconds a round that drafts ``h`` tokens, each kept with probability ``accept`` given
        the earlier ones were, is expected to spend taking its caches back (0 on KV caches)."""
        return self.rollbacks.round(self.target, self.draft, h, accept) if self.rollbacks is not None else 0.0

    def observe_target(self, rows: int, seconds: float, count: int = 1) -> bool:
        """Learn from a target decode if it is warm: of the same kind (one row, or a batch) as
        the decode before it; returns whether it was. ``count``: that many one-row decodes in a
        row taking ``seconds`` each (a run's mean, ``fly_cpp.rounds.runs``), learned as as many
        observations but the first where it is not warm (its switch is not told apart: the
        mean hides it); returns whether any was warm. On a GPU llama.cpp builds the graph anew
        when the kind changes (and a one-row decode then captures its CUDA graph again): on the
        synthetic costly pair on an H100, batches after runs of one-row decodes took 1.5x their
        calibrated time and steady ones 0.54x; the scales learned from the switches alone, and
        drafting looked dear where drafting every round ran 1.5x the target. What a switch
        costs over a warm decode is learned apart (``switch``): on a CPU it is nothing next to a
        1.5B model's decode (under 1%), but it is half a one-row decode of the bundled 260K
        model (0.18 ms after a batch against 0.12 ms after a one-row decode)."""
        first_warm = self._batched is (rows > 1)
        switched = self._batched is not None and not first_warm
        self._batched = rows > 1
        if switched and count == 1:
            # at most a one-row decode: a GPU kernel's first use costs tens of them, not a switch's price
            extra = min(max(seconds - self.target(rows), 0.0), self.target(1))
            self.switch = ema(self.switch, extra, ROUND)
        count -= not first_warm
        if count <= 0:
            return False
        batch = rows > 1
        self._seen[batch] = True
        ratio = seconds / self.target_curve(rows, self.depth)
        for _ in range(count):
            if self._check(batch, ratio):
                pass
            elif batch:
                self.batch_scale = _blend(self.target_scale if self.batch_scale is None else self.batch_scale, ratio)
            elif self._guessed is not None and len(self._guessed) < MEDIAN_OF:
                # a guess gives way to what is seen: the one-row scale that followed the batches is
                # the median of its own first decodes (a machine whose one-row decodes had sped up
                # to 0.70x their curve while its batches had not: at a tenth a decode, drafting
                # went on looking cheaper than the target alone for tens of rounds)
                self._guessed.append(ratio)
                self.target_scale = statistics.median(self._guessed)
            else:
                self.target_scale = _blend(self.target_scale, ratio)
        if batch and not self._seen[False]:
            # until a one-row decode is seen it follows the batches, as they follow it: a run
            # that drafted every round found batches 1.63x their cached curve (the machine ran
            # slower than when it was measured) and kept the one-row cost, so the target alone
            # looked cheap and the curve cached from it priced drafting too dear
            self.target_scale = self.batch_scale  # type: ignore[assignment]
            self._guessed = []
        return True

    def _check(self, batch: bool, ratio: float) -> bool:
        """A cached curve against the first warm live decodes of each kind: where their median
        is off by more than CHECK_TOLERANCE either way (a calibration taken while other work
        ran: a one-row decode timed at 4.9 s and 6 rows at 5.4 s made batches look free, and
        every later run drafted where nothing pays), that kind's scale jumps to it at once and
        the curve is marked to be cached as the live decodes price it (``live``). Returns
        whether the scale was set.

        The other kind's scale, where its own check has not settled it yet, becomes the median of
        what that check has seen so far: it was learned from the contradicted curve in steps held
        to a tenth, and the live ratios its check kept are the better price. Under load on the
        bundled pair, a batch decoded before the one-row check settled kept a scale of 0.86-0.95
        beside a one-row scale set to 0.02-0.03 (its live ratio 0.03-0.04); batches then looked
        about 30x dearer than they were, no round drafted again, and the curve rescaled from
        those scales was unfit to cache: 3 of 126 runs of a 20x too dear cached curve beside
        three busy processes (`tests/test_costs.py`'s flaky test), none of 60 since."""
        seen = self._checks[batch]
        if not self.cached or len(seen) >= MEDIAN_OF:
            return False
        mid = _contradicted(seen, ratio, self.prior)
        if mid is None:
            return False
        self.disagrees = True
        other = self._checks[not batch]
        if batch:
            self.batch_scale = mid
            if 0 < len(other) < MEDIAN_OF:
                self.target_scale = statistics.median(other)
        else:
            self.target_scale = mid
            if 0 < len(other) < MEDIAN_OF and self.batch_scale is not None:
                self.batch_scale = statistics.median(other)
        return True

    def live(self) -> tuple[Curve, Curve | None]:
        """The curves as the live decodes price them: each scaled by its running scale."""
        batch = self.target_scale if self.batch_scale is None else self.batch_scale
        draft = self.draft_curve.scaled(self.draft_scale, self.draft_scale) if self.draft_curve is not None else None
        return self.target_curve.scaled(self.target_scale, batch), draft

    def recached(self, measured: str | None) -> None:
        """The cache no longer holds these curves as given: it holds them as ``live`` priced
        them (``measured``: their note), or nothing (None)."""
        self.cached = False
        if measured is not None:
            self.measured = measured

    def entering(self) -> float:
        """What a batch now costs beyond its warm price, the switch back to one-row decodes
        included: nothing when the last decode was a batch (or a prompt)."""
        return 2 * self.switch if self._batched is False else 0.0

    def observe_host(self, seconds: float, count: int = 1) -> None:
        """``count`` rounds that each spent ``seconds`` outside the decodes (a run's mean)."""
        weight = 1 - (1 - ROUND) ** count
        self.host = max(seconds, 0.0) if self.host == 0 else ema(self.host, max(seconds, 0.0), weight)

    def observe_planning(self, seconds: float) -> None:
        """A planned round that drafted nothing spent ``seconds`` in its drafter: planning, looking up."""
        self.planning = max(seconds, 0.0) if self.planning == 0 else ema(self.planning, max(seconds, 0.0), ROUND)

    def drafted(self, drafting: bool) -> None:
        """Whether the draft model decoded in this round: its decodes in the next one teach then."""
        self._draft_warm = drafting

    @property
    def draft_checked(self) -> bool:
        """The draft curve needs no live decodes to be trusted: measured by this process, or its
        cached price checked (``observe_draft``), here or by an earlier process."""
        return self.draft_curve is None or not self.draft_cached or self.draft_trusted or self.draft_checked_live

    @property
    def draft_checked_live(self) -> bool:
        """This process's live draft decodes checked the cached draft curve."""
        return len(self._draft_checks) >= MEDIAN_OF

    def draft_checks_left(self) -> int:
        """The warm draft decodes this process still needs to check a cached draft curve (0: none)."""
        return 0 if self.draft_checked else MEDIAN_OF - len(self._draft_checks)

    def draft_noted(self) -> None:
        """The cache now says that the draft curve was checked."""
        self.draft_trusted = True

    def observe_draft(self, rows: int, seconds: float) -> None:
        """A draft decode, learned from when the draft model decoded in the last round too (its
        first decode after idle rounds switches kinds as the target's do). A cached draft curve
        is checked by its first warm live decodes as the target's are (``_check``): where their
        median is off by more than CHECK_TOLERANCE the scale jumps to it (learned a tenth a decode
        alone, a draft curve cached 3x too dear on the F16 pair stayed so for every later process)."""
        warm, self._draft_warm = self._draft_warm, True  # the next draft decode follows this one
        if self.draft_curve is None or rows <= 0 or not warm:
            return
        ratio = seconds / self.draft_curve(rows, self.depth)
        seen = self._draft_checks
        if self.draft_cached and not self.draft_trusted and len(seen) < MEDIAN_OF:
            mid = _contradicted(seen, ratio, self.prior)
            if mid is not None:
                self.disagrees, self.draft_scale = True, mid
                return
        self.draft_scale = _blend(self.draft_scale, ratio)

    def as_dict(self) -> dict[str, object]:
        """Milliseconds by rows, as calibrated (at ``*_depth`` tokens of context; ``*_ms_per_1k``:
        what 1000 more add), and the running scales."""
        t, d = self.target_curve, self.draft_curve
        return {"target_ms": t.as_dict(), "target_depth": t.depth, "target_ms_per_1k": _per_1k(t),
                "draft_ms": d.as_dict() if d is not None else None, "draft_depth": d.depth if d is not None else None,
                "draft_ms_per_1k": _per_1k(d) if d is not None else None,
                "target_scale": round(self.target_scale, 3),
                "batch_scale": round(self.batch_scale, 3) if self.batch_scale is not None else None,
                "draft_scale": round(self.draft_scale, 3),
                "host_ms": round(self.host * 1e3, 3), "planning_ms": round(self.planning * 1e3, 3), "switch_ms": round(self.switch * 1e3, 3),
                "cached": self.cached, "prior": self.prior, "measured": self.measured, "disagrees": self.disagrees,
                "draft_checked": self.draft_checked,
                "rollbacks": self.rollbacks.as_dict() if self.rollbacks is not None else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Costs:
        """The curves and running scales of ``as_dict`` (to its rounding), e.g. a bench record's
        pacing, to price recorded rounds at the costs a run measured (scripts/round_prices.py)."""
        return cls(_from_ms(d["target_ms"], d["target_depth"], d["target_ms_per_1k"]),
                   _from_ms(d["draft_ms"], d["draft_depth"], d["draft_ms_per_1k"]) if d.get("draft_ms") else None,
                   scales=(d["target_scale"], d["batch_scale"], d["draft_scale"]))


def _per_1k(curve: Curve) -> dict[str, float]:
    return {str(r): round(s * 1e6, 3) for r, s in zip(curve.rows, curve.per_token)}


def _from_ms(ms: dict[str, float], depth: int, per_1k: dict[str, float] | None) -> Curve:
    """A curve from ``as_dict``'s milliseconds by rows and microseconds per token of depth."""
    rows = sorted(int(r) for r in ms)
    return Curve(tuple(rows), tuple(ms[str(r)] / 1e3 for r in rows), depth,
                 tuple(per_1k[str(r)] / 1e6 for r in rows) if per_1k else ())


def _contradicted(seen: list[float], ratio: float, prior: bool = False) -> float | None:
    """A cached curve's check (fewer than MEDIAN_OF live ratios ``seen``) takes ``ratio``: the
    median of its ratios once it has MEDIAN_OF and that is off by more than CHECK_TOLERANCE
    either way (a ``prior``'s: off at all), else None."""
    seen.append(ratio)
    mid = statistics.median(seen)
    if len(seen) < MEDIAN_OF:
        return None
    return mid if prior or not 1 / CHECK_TOLERANCE <= mid <= CHECK_TOLERANCE else None


def _blend(scale: float, ratio: float) -> float:
    """One observation's step: ``ratio`` held within half and twice the scale, so that a
    one-off (a GPU's first decode of a new kind of batch sets up its kernels: on an H100 one
    took tens of times its calibrated cost) moves the scale by a tenth at most, where it once
    moved it 40% and kept drafting off; a real change is followed over a few rounds. No bound
    holds the scale itself: one held within 0.2-5 of the curve crept up a tenth a decode after a
    contradicted curve's check set it to 0.022, to 9x the live cost."""
    return ema(scale, min(max(ratio, 0.5 * scale), 2.0 * scale), ROUND)


def format_curve(costs: Costs, depth: int = 0) -> str:
    """The calibrated curves as a table at ``depth`` tokens of context: ms by rows, and each as a
    multiple of one target decode at that depth."""
    target, draft = costs.target_curve, costs.draft_curve
    single = target(1, depth)
    lines = [f"at {depth} tokens of context",
             f"{'rows':>5} {'target ms':>10} {'x 1 row':>8} {'draft ms':>9} {'x target':>9}"]
    for r in sorted({*target.rows, *(draft.rows if draft else ())}):
        t = target(r, depth)
        d = f"{draft(r, depth) * 1e3:9.2f} {draft(r, depth) / single:9.2f}" if draft else ""
        lines.append(f"{r:>5} {t * 1e3:10.2f} {t / single:8.2f} {d}")
    return "\n".join(lines)

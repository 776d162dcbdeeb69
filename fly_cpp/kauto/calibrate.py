"""Calibrating a pair: timing llama_decode for a few batch sizes on both models, twice (the
second time ``SPAN`` tokens deeper), the sizes taking turns so that a burst of other work cannot
bend one size alone; cached (``fly_cpp.kauto.costcache``) so that it happens once per pair and
machine. A curve the machine's load bent (``Curve.plausible``) is measured again, and never
cached. A target with its own MTP head and no draft model has the head's curve in the draft's
place: one head decode of n rows (the catch-up of a round, then one row a drafted token),
measured the same way and cached under the same key of the pair, beside the target's.

A cached calibration that a process's live decodes contradict (``Costs.disagrees``) is cached
again as they priced it (``store_live``): measuring again would land inside the next process's
answer, seconds of work a user waits for (on the F16 Qwen pair a fresh process that did so ran
its answer at half the target's speed). Only a rescaled curve unfit to cache is dropped."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Sequence
from time import perf_counter
from typing import Literal, Protocol

import numpy as np

from fly_cpp.backend.context import Context
from fly_cpp.backend.fit import placed
from fly_cpp.backend.mtp import MtpContext
from fly_cpp.config import ModelSettings
from fly_cpp.kauto import costcache
from fly_cpp.kauto import prior as priors
from fly_cpp.kauto.costs import Costs, Curve
from fly_cpp.kauto.rollback_costs import Rollbacks

TARGET_ROWS = priors.TARGET_ROWS  # the target's sizes timed: every draft length to 16, finer where rounds are
DRAFT_ROWS = priors.DRAFT_ROWS  # 1, 2, 4, ... LARGEST_TIMED
MIN_SECONDS = 0.02  # each size timed (after one untimed warm-up) MEDIAN_OF times, and more, up to MAX_REPEATS, until this long
MAX_REPEATS = 15  # ... bounding a size's decodes where each is far under MIN_SECONDS (a GPU's)
MEASURE_TRIES = 3  # tries of a curve while it is implausible (a busy machine bent it), within RETRY_SECONDS
RETRY_SECONDS = 10.0  # no new try starts after this long measuring one model (a busy machine: 74 ms a decode
# at 2 threads beside a load of 9 made three tries of a 260K-parameter pair take a minute)
SPAN = 512  # tokens of context between a calibration's two curves (fewer in a small context)
RESCALED_SINCE = "; calibrated "  # in a rescaled curve's note: when the curve it rescaled was measured
FLAT = 1.25  # on a CPU a batch of 4+ rows costs more than this many one-row decodes (stories260K: 1.4x at 4 rows)


class Decoder(Protocol):
    """What ``measure`` times: a context's decodes at its cache's end, and going back."""

    n_batch: int
    n_ubatch: int
    tokens: list[int]

    @property
    def n_ctx(self) -> int: ...

    def decode(self, tokens: Sequence[int], logits: Literal["all", "none"]) -> object: ...

    def truncate(self, n: int) -> None: ...

    def checkpoint(self) -> object: ...


class HeadDecodes:
    """An MTP head's context as ``measure`` times it: each row paired with a zero state (what a
    decode costs does not depend on the state's values); its plain KV cache goes back exactly."""

    def __init__(self, ctx: MtpContext) -> None:
        self.ctx, self.n_batch, self.n_ubatch = ctx, ctx.n_batch, ctx.n_batch
        self._zeros = np.zeros((ctx.n_batch, ctx.n_embd), dtype=np.float32)

    @property
    def tokens(self) -> list[int]:
        return self.ctx.tokens

    @property
    def n_ctx(self) -> int:
        return self.ctx.target.n_ctx

    def decode(self, tokens: Sequence[int], logits: Literal["all", "none"]) -> object:
        for lo in range(0, len(tokens), self.n_batch):
            part = tokens[lo:lo + self.n_batch]
            self.ctx.decode(part, self._zeros[: len(part)])
        return None

    def truncate(self, n: int) -> None:
        self.ctx.truncate(n)

    def checkpoint(self) -> object:
        return None


def measure(ctx: Decoder, rows: Sequence[int], token: int, repeats: int = costcache.MEDIAN_OF) -> Curve:
    """Time decodes of ``rows`` copies of ``token`` at the cache's current end, rolling back
    after each (the cache is left as it was, but for room made at its end for the largest
    batch when the context is nearly full). The sizes take turns, pass after pass (the first
    one untimed: caches, allocations), and each keeps its median: a burst of other work on the
    machine then bends one pass of every size, which the median drops, rather than every
    timing of one size (a one-row decode timed 48% dear that way made batches look nearly
    free). A decode of more rows never costs less than one of fewer (the curve is made
    non-decreasing: timing noise must not make batches look free)."""
    rows = timed_sizes(rows, ctx.n_ubatch)
    top = min(max(rows), ctx.n_batch, ctx.n_ctx)
    if len(ctx.tokens) > ctx.n_ctx - top:  # make room at the end (drops cached tokens, once)
        ctx.truncate(ctx.n_ctx - top)
    base = len(ctx.tokens)
    ctx.checkpoint()  # each timed decode is rolled back whole: a recurrent state comes back from a copy
    sizes = [r for r in rows if r <= top]
    times: list[list[float]] = [[] for _ in sizes]
    for rep in range(MAX_REPEATS + 1):
        for r, timed in zip(sizes, times):
            t0 = perf_counter()
            ctx.decode([token] * r, logits=min(r, TARGET_ROWS[-1]))  # as many as a round verifies at most
            if rep:
                timed.append(perf_counter() - t0)
            ctx.truncate(base)
        if rep >= repeats and all(sum(timed) >= MIN_SECONDS for timed in times):
            break
    seconds: list[float] = []
    for timed in times:
        seconds.append(max(statistics.median(timed), seconds[-1] if seconds else 0.0))
    return Curve(tuple(sizes), tuple(seconds), depth=base)


def timed_sizes(rows: Sequence[int], n_ubatch: int) -> tuple[int, ...]:
    """The sizes of ``rows`` worth timing with micro-batches of ``n_ubatch`` rows: past one
    micro-batch a decode is several in a row, so two sizes past it give the slope the curve goes
    on with (``Curve`` is linear beyond its last two sizes). With ``--n-ubatch 1`` on the F16
    Qwen pair the 17-row size alone took about 3 s a pass."""
    return tuple(r for r in rows if r <= n_ubatch) + tuple(r for r in rows if r > n_ubatch)[:2]


def measure_deep(ctx: Decoder, rows: Sequence[int], token: int, repeats: int = costcache.MEDIAN_OF) -> Curve:
    """``measure`` at the cache's end and again ``SPAN`` tokens deeper (filler tokens, removed
    after): one curve, linear in the depth, that prices a decode wherever the cache ends. The
    cache is left as it was, but for room made at its end when the context is nearly full."""
    top = min(max(rows), ctx.n_batch, ctx.n_ctx)
    span = min(SPAN, (ctx.n_ctx - top) // 2)
    if len(ctx.tokens) > ctx.n_ctx - top - span:
        ctx.truncate(max(ctx.n_ctx - top - span, 0))
    base = len(ctx.tokens)
    near = measure(ctx, rows, token, repeats)
    if span <= 0:
        return near
    ctx.decode([token] * span, logits="none")
    far = measure(ctx, rows, token, repeats)
    ctx.truncate(base)
    return dataclasses.replace(near, per_token=tuple(max(f - n, 0.0) / span for n, f in zip(near.seconds, far.seconds)))


def _curve(entry: object) -> Curve | None:
    """A cached curve; None for one that is malformed or was measured at one depth only."""
    try:
        rows, secs, slopes = entry["rows"], entry["seconds"], entry["per_token"]  # type: ignore[index]
        curve = Curve(tuple(int(r) for r in rows), tuple(float(s) for s in secs), int(entry["depth"]),  # type: ignore[index]
                      tuple(float(s) for s in slopes))
        return curve if curve.rows and len(curve.rows) == len(curve.seconds) == len(curve.per_token) else None
    except (KeyError, TypeError, ValueError):
        return None


def _entry(curve: Curve | None) -> dict[str, object] | None:
    return None if curve is None else {"rows": curve.rows, "seconds": curve.seconds, "depth": curve.depth,
                                       "per_token": curve.per_token}


def pair_key(target: Context, target_settings: ModelSettings, draft: Context | None,
             draft_settings: ModelSettings | None) -> str:
    """The pair's key in the cost cache, as its contexts were loaded."""
    return costcache.cache_key(target_settings, target.n_threads, draft_settings, draft.n_threads if draft is not None else 0)


def calibrate(target: Context, target_settings: ModelSettings, draft: Context | None,
              draft_settings: ModelSettings | None, token: int, *, refresh: bool = False,
              mtp: MtpContext | None = None, basis: dict[str, object] | None = None) -> Costs:
    """The pair's cost model: from the cache when this pair, loaded this way on this machine,
    was measured before (unless ``refresh``), else measured now (seconds to half a minute: k auto
    never calls this inside an answer, it starts from ``prior``) and cached, with ``basis``.
    ``mtp`` (with no draft model): the target's MTP head drafts, its curve is the draft's."""
    if not refresh and (known := cached(target, target_settings, draft, draft_settings, mtp)) is not None:
        return known
    key = pair_key(target, target_settings, draft, draft_settings)
    rollbacks = Rollbacks.of(target, draft)
    t, t_ok = _measure_plausibly(target, TARGET_ROWS, token, on_cpu(target_settings))
    d, d_ok = (_measure_plausibly(draft, DRAFT_ROWS, token, draft_settings is None or on_cpu(draft_settings))
               if draft is not None else (None, True))
    # a head's batch outputs one row of logits (over the whole vocabulary), as its catch-up does:
    # a flat curve is what it is, not the mark of a busy machine
    m, m_ok = (_measure_plausibly(HeadDecodes(mtp), DRAFT_ROWS, token, cpu=False)
               if mtp is not None and draft is None else (None, True))
    when = _when()
    if t_ok and d_ok and m_ok:  # a curve the machine's load bent is used now but measured again next time
        _store(key, t, d, m, when, basis=basis)
    return Costs(t, d if m is None else m, rollbacks=rollbacks, measured=when)


def cached(target: Context, target_settings: ModelSettings, draft: Context | None,
           draft_settings: ModelSettings | None, mtp: MtpContext | None = None) -> Costs | None:
    """The pair's cost model from the cache, or None when it was never measured (nothing is
    measured here); with ``mtp`` (and no draft model), None too when the head was not."""
    key = pair_key(target, target_settings, draft, draft_settings)
    entry = costcache.load().get(key)
    if entry is None:
        return None
    t = _curve(entry.get("target"))
    head = mtp is not None and draft is None
    d = _curve(entry.get("draft")) if draft is not None else _curve(entry.get("mtp")) if head else None
    if t is None or ((draft is not None or head) and d is None):
        return None
    when = entry.get("measured")
    return Costs(t, d, cached=True, rollbacks=Rollbacks.of(target, draft), measured=when if isinstance(when, str) else "",
                 draft_checked=entry.get("draft_checked") is True)


def shape(ctx: Context) -> priors.Shape:
    """What the prior prices a model by: its GGUF's bytes, parameters and layers, and how many of
    those layers went to a GPU."""
    m = ctx.model
    return priors.Shape(m.size_bytes, m.n_params, m.n_layer, m.offloaded)


def basis(target: Context, target_settings: ModelSettings, draft: Context | None,
          draft_settings: ModelSettings | None) -> dict[str, object]:
    """What a cached entry records of its models for later pairs' priors: each model's id,
    threads and shape, and the machine."""
    def one(ctx: Context, settings: ModelSettings) -> dict[str, object]:
        return {"id": costcache.model_id(settings, ctx.n_threads), "threads": ctx.n_threads,
                "shape": shape(ctx).as_dict()}
    return {"machine": costcache.machine_id(), "target": one(target, target_settings),
            "draft": one(draft, draft_settings) if draft is not None and draft_settings is not None else None}


def prior(target: Context, target_settings: ModelSettings, draft: Context | None,
          draft_settings: ModelSettings | None, mtp: MtpContext | None = None) -> Costs:
    """The pair's cost model before any of its decodes is timed (``fly_cpp.kauto.prior``): from the
    models' headers and what this machine learned for other pairs; nothing is measured. The
    live decodes of the first generation set its scales, and it is cached as they priced it."""
    known = priors.known_curves(costcache.load(), costcache.machine_id(), _curve)
    t = priors.of_model(costcache.model_id(target_settings, target.n_threads), shape(target), target.n_threads,
                        TARGET_ROWS, known)
    d: Curve | None = None
    if draft is not None and draft_settings is not None:
        d = priors.of_model(costcache.model_id(draft_settings, draft.n_threads), shape(draft), draft.n_threads,
                            DRAFT_ROWS, known)
    elif mtp is not None:
        m = target.model
        d = priors.curve(priors.head(shape(target), m.n_vocab, m.n_embd),
                         priors.machine(known, target.n_threads),
                         DRAFT_ROWS)
    return Costs(t, d, rollbacks=Rollbacks.of(target, draft), measured="prior (nothing timed yet)", prior=True)


def _measure_plausibly(ctx: Decoder, rows: Sequence[int], token: int, cpu: bool) -> tuple[Curve, bool]:
    """``measure_deep``, again (up to MEASURE_TRIES times) while the curve is not plausible (a busy
    machine made some sizes far dearer than they are; no new try after RETRY_SECONDS); the last
    one bounded if it never is.
    The flag: a curve fit to cache was measured (plausible, and, on a CPU, not ``flat``: a flat
    curve is what a busy machine gives every time, so it is used now without measuring again)."""
    start = perf_counter()
    for _ in range(MEASURE_TRIES):
        curve = measure_deep(ctx, rows, token)
        if curve.plausible:
            return curve, fit(curve, cpu)
        if perf_counter() - start > RETRY_SECONDS:
            break
    return curve.bounded(), False


def fit(curve: Curve, cpu: bool) -> bool:
    """Whether ``curve`` may be cached: plausible, and on a CPU not ``flat``."""
    return curve.plausible and not (cpu and flat(curve))


def store_live(key: str, costs: Costs, target_settings: ModelSettings, draft_settings: ModelSettings | None,
               head: bool = False, basis: dict[str, object] | None = None) -> str | None:
    """Cache ``costs``' curves as its live decodes priced them (``Costs.live``), noting when and
    under what load, and when the curve it rescaled was measured; returns that note. When a
    rescaled curve is unfit to cache, the pair's entry is dropped instead (the next process
    measures again) and None returned. ``head``: the draft's place holds the target's MTP head."""
    target, draft = costs.live()
    if costs.prior:  # the live scales are all there is: a shape they bent past plausible is held to it
        target, draft = target.bounded(), draft.bounded() if draft is not None else None
    draft_cpu = not head and (draft_settings is None or on_cpu(draft_settings))
    if not fit(target, on_cpu(target_settings)) or (draft is not None and not fit(draft, draft_cpu)):
        costcache.drop(key)
        return None
    if costs.prior:
        note = f"learned from live decodes {_when()} (from the prior)"
    else:
        first = costs.measured.split(RESCALED_SINCE, 1)[-1]  # a rescaled curve's own calibration, once
        note = f"rescaled from live decodes {_when()}{RESCALED_SINCE}{first or 'unknown'}"
    _store(key, target, None if head else draft, draft if head else None, note, costs.draft_checked, basis)
    return note


def store_draft_checked(key: str) -> None:
    """Note in the pair's entry that live decodes checked its draft curve (``Costs.draft_checked``)."""
    costcache.note(key, draft_checked=True)


def flat(curve: Curve) -> bool:
    """Its batches (4 rows or more) cost hardly more than a one-row decode: on a CPU that is
    other work on the machine inflating the one-row timings (a one-row decode timed at 4.9 s and
    6 rows at 5.4 s beside a load of 7 made every later run draft where nothing pays)."""
    big = [s for r, s in zip(curve.rows, curve.seconds) if r >= 4]
    return bool(big) and max(big) <= FLAT * curve.seconds[0]


def on_cpu(settings: ModelSettings) -> bool:
    """The model's layers stay on this machine's CPU: no offload asked for, or "every layer"
    (the default) where there is no GPU or rpc server to take them."""
    return placed(settings).offloaded_layers == 0


def _store(key: str, target: Curve, draft: Curve | None, mtp: Curve | None, when: str,
           draft_checked: bool = False, basis: dict[str, object] | None = None) -> None:
    entry: dict[str, object] = {"target": _entry(target), "draft": _entry(draft), "measured": when}
    if basis is not None:  # what later pairs' priors read of it (``prior``)
        entry["basis"] = basis
    if draft_checked:  # by live decodes: a later process need not check it again (``Costs.draft_checked``)
        entry["draft_checked"] = True
    costcache.store(key, entry if mtp is None else {**entry, "mtp": _entry(mtp)})


def _when() -> str:
    """When a calibration ran and how busy the machine was (the load average over a minute:
    other work bends a calibration, and a user reading the curve should know)."""
    load = f", load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores" if hasattr(os, "getloadavg") else ""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()) + load

"""What a forward pass costs on this machine: measured, cached, and kept current.

A round of speculative decoding pays for drafting (one draft decode per step, plus the rows it
catches up on) and for one target decode of the drafted rows plus one. Whether that beats a
plain target decode depends on the machine, the models, their quantization, the threads and
the offload, so nothing here is assumed: ``measure`` times llama_decode on a context for a few
batch sizes (``Curve``: seconds by rows, linear in between), twice, the second time with
``SPAN`` more tokens in the cache: a decode also reads the cache it attends over, and on a
CPU that grows with the context (the synthetic costly target: 17 rows take 92 ms at 8 tokens
of context and 207 ms at 250), so a curve measured on an empty cache priced the batches of a
real generation at half what they cost. ``Curve`` is linear in the depth too. ``calibrate`` does it for a pair
and caches the result in ``<cache>/costs.json`` under a key made of everything that changes
it (the model files, the settings they are loaded with, the machine and the llama.cpp build),
and ``Costs`` scales the curves by what real rounds take (``observe_*``: a busy machine, a
GPU, a throttled CPU are handled alike). A curve whose batches cost far more per row than single
decodes (``Curve.plausible``) was bent by other work while it was measured: it is measured again,
and never cached. A plain one-row target decode and a batch are scaled
apart: a calibration can misjudge one and not the other (a one-row decode measured 26% fast made
every batch look 35% dear, and drafting stopped where it paid), and each is seen often enough to
correct itself: plain decodes between drafts, batches in every drafting round.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import statistics
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from fly_cpp import rollback as rb
from fly_cpp._llama import Context, Model, backend_version
from fly_cpp.config import ModelSettings
from fly_cpp.errors import FlyError

TARGET_ROWS = (1, 2, 3, 4, 6, 8, 12, 17)
DRAFT_ROWS = (1, 2, 4, 8, 16, 32)
REPEATS = 3  # timed decodes per size at least (after one untimed warm-up), the median kept
MIN_SECONDS = 0.02  # ... and more, up to MAX_REPEATS, until a size has been timed this long
MAX_REPEATS = 15
TABLE_ROWS = 64  # curve values kept ready for batches up to this many rows
SMOOTHING = 0.1  # weight of one round in the running scale
MAX_ENTRIES = 64
MIN_SHALLOW = 0.25  # a decode on a shallower cache than measured costs at least this share of it
MAX_PER_ROW = 1.5  # a batch of n rows costs at most this times n one-row decodes (2-row Q4_K_M on a CPU: 2.02)
MEASURE_TRIES = 3
SWITCH_MAX = 1.0  # a switch of kinds costs at most this many one-row decodes (a GPU kernel's first use costs tens: not a switch's price)
SNAPSHOT_EDGE = 0.75  # snapshots are picked unless checkpoints measure cheaper than this share of them
SPAN = 512  # tokens of context between a calibration's two curves (fewer in a small context)
_file_lock = threading.Lock()


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
        """Seconds for 0..TABLE_ROWS rows at ``depth``: the pacer asks for these every round."""
        return tuple(_interpolate(self.rows, self.seconds, n) for n in range(TABLE_ROWS + 1))

    @functools.cached_property
    def _slopes(self) -> tuple[float, ...]:
        return tuple(_interpolate(self.rows, self.per_token, n) if self.per_token else 0.0
                     for n in range(TABLE_ROWS + 1))

    def __call__(self, n: int, depth: int | None = None) -> float:
        """Seconds of a decode of ``n`` rows after ``depth`` tokens (None: at the measured depth)."""
        if 0 <= n <= TABLE_ROWS:
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


def measure(ctx: Context, rows: Sequence[int], token: int, repeats: int = REPEATS) -> Curve:
    """Time decodes of ``rows`` copies of ``token`` at the cache's current end, rolling back
    after each (the cache is left as it was, but for room made at its end for the largest
    batch when the context is nearly full). The sizes take turns, pass after pass (the first
    one untimed: caches, allocations), and each keeps its median: a burst of other work on the
    machine then bends one pass of every size, which the median drops, rather than every
    timing of one size (a one-row decode timed 48% dear that way made batches look nearly
    free). A decode of more rows never costs less than one of fewer (the curve is made
    non-decreasing: timing noise must not make batches look free)."""
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
            ctx.decode([token] * r, logits="all")
            if rep:
                timed.append(perf_counter() - t0)
            ctx.truncate(base)
        if rep >= repeats and all(sum(timed) >= MIN_SECONDS for timed in times):
            break
    seconds: list[float] = []
    for timed in times:
        seconds.append(max(statistics.median(timed), seconds[-1] if seconds else 0.0))
    return Curve(tuple(sizes), tuple(seconds), depth=base)


def measure_deep(ctx: Context, rows: Sequence[int], token: int, repeats: int = REPEATS) -> Curve:
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


def _identity(settings: ModelSettings, threads: int) -> dict[str, object]:
    stat = os.stat(settings.path)
    loaded = {k: v for k, v in dataclasses.asdict(settings).items() if k not in ("path", "n_ctx", "n_threads")}
    return {"path": os.path.abspath(settings.path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "threads": threads, **loaded}


def _machine() -> dict[str, object]:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu": model or platform.processor(), "cores": os.cpu_count(),
            "llama.cpp": backend_version()}


def cache_path() -> Path:
    """``$FLY_CPP_COSTS``, else ``costs.json`` in fly-cpp's cache directory."""
    if os.environ.get("FLY_CPP_COSTS"):
        return Path(os.environ["FLY_CPP_COSTS"]).expanduser()
    root = os.environ.get("FLY_CPP_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "fly-cpp")
    return Path(root).expanduser() / "costs.json"


def cache_key(target: ModelSettings, target_threads: int, draft: ModelSettings | None, draft_threads: int) -> str:
    parts = {"target": _identity(target, target_threads),
             "draft": _identity(draft, draft_threads) if draft is not None else None, "on": _machine()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _load_cache() -> dict[str, dict[str, object]]:
    try:
        data = json.loads(cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


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


class Costs:
    """The cost model of one pair: calibrated curves, at the depth the caches have now
    (``at``), times running scales (the target's: one for a plain one-row decode, one for
    batches, which follows the first until a batch is seen)."""

    def __init__(self, target: Curve, draft: Curve | None, *, cached: bool = False,
                 rollbacks: Rollbacks | None = None) -> None:
        self.target_curve, self.draft_curve = target, draft
        self.cached = cached  # the curves came from the cache, not from a measurement now
        self.rollbacks = rollbacks  # recurrent/hybrid caches: what going back costs (None: KV caches, free)
        self.target_scale = self.draft_scale = 1.0
        self.batch_scale: float | None = None  # target batches (2+ rows); None: none seen yet
        self.host = 0.0  # seconds a round spends outside the decodes (verifying, emitting), lately
        self.switch = 0.0  # seconds a target decode of the other kind than the last costs over a warm one, lately
        self.depth = 0  # tokens in the caches this round (both models hold about as many)
        self._batched: bool | None = None  # the target's last decode had 2+ rows (None: not since ``cold``)
        self.draft_warm = False  # the draft model decoded in the last round too (its decodes now teach)

    def cold(self) -> None:
        """A decode outside the rounds (a prompt) came last: the next round's decodes are not warm."""
        self._batched, self.draft_warm = None, False

    def at(self, depth: int) -> None:
        """This round's decodes come after ``depth`` tokens of context."""
        self.depth = depth

    def target(self, rows: int) -> float:
        """Seconds of one target decode of ``rows`` rows, now."""
        scale = self.target_scale if rows <= 1 or self.batch_scale is None else self.batch_scale
        return self.target_curve(rows, self.depth) * scale

    def draft(self, rows: int) -> float:
        """Seconds of one draft decode of ``rows`` rows, now (0 without a draft model)."""
        return self.draft_curve(rows, self.depth) * self.draft_scale if self.draft_curve is not None else 0.0

    def rollback(self, h: int, accept: float) -> float:
        """Seconds a round that drafts ``h`` tokens, each kept with probability ``accept`` given
        the earlier ones were, is expected to spend taking its caches back (0 on KV caches)."""
        return self.rollbacks.round(self, h, accept) if self.rollbacks is not None else 0.0

    def observe_target(self, rows: int, seconds: float) -> bool:
        """Learn from a target decode if it is warm: of the same kind (one row, or a batch) as
        the decode before it; returns whether it was. On a GPU llama.cpp builds the graph anew
        when the kind changes (and a one-row decode then captures its CUDA graph again): on the
        synthetic costly pair on an H100, batches after runs of one-row decodes took 1.5x their
        calibrated time and steady ones 0.54x; the scales learned from the switches alone, and
        drafting looked dear where drafting every round ran 1.5x the target. What a switch
        costs over a warm decode is learned apart (``switch``): on a CPU it is nothing next to a
        1.5B model's decode (under 1%), but it is half a one-row decode of the bundled 260K
        model (0.18 ms after a batch against 0.12 ms after a one-row decode)."""
        warm = self._batched is (rows > 1)
        switched = self._batched is not None and not warm
        self._batched = rows > 1
        if switched:
            extra = min(max(seconds - self.target(rows), 0.0), SWITCH_MAX * self.target(1))
            self.switch = (1 - SMOOTHING) * self.switch + SMOOTHING * extra
        if not warm:
            return False
        ratio = seconds / self.target_curve(rows, self.depth)
        if rows <= 1:
            self.target_scale = _blend(self.target_scale, ratio)
        else:
            self.batch_scale = _blend(self.target_scale if self.batch_scale is None else self.batch_scale, ratio)
        return True

    def entering(self) -> float:
        """What a batch now costs beyond its warm price, the switch back to one-row decodes
        included: nothing when the last decode was a batch (or a prompt)."""
        return 2 * self.switch if self._batched is False else 0.0

    def observe_host(self, seconds: float) -> None:
        self.host = max(seconds, 0.0) if self.host == 0 else (1 - SMOOTHING) * self.host + SMOOTHING * max(seconds, 0.0)

    def observe_draft(self, rows: int, seconds: float) -> None:
        """A draft decode, learned from when the draft model decoded in the last round too (its
        first decode after idle rounds switches kinds as the target's do)."""
        if self.draft_curve is not None and rows > 0 and self.draft_warm:
            self.draft_scale = _blend(self.draft_scale, seconds / self.draft_curve(rows, self.depth))

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
                "host_ms": round(self.host * 1e3, 3), "switch_ms": round(self.switch * 1e3, 3),
                "cached": self.cached, "rollbacks": self.rollbacks.as_dict() if self.rollbacks is not None else None}


def _per_1k(curve: Curve) -> dict[str, float]:
    return {str(r): round(s * 1e6, 3) for r, s in zip(curve.rows, curve.per_token)}


def _blend(scale: float, ratio: float) -> float:
    """One observation's step: ``ratio`` held within half and twice the scale, so that a
    one-off (a GPU's first decode of a new kind of batch sets up its kernels: on an H100 one
    took tens of times its calibrated cost) moves the scale by a tenth at most, where it once
    moved it 40% and kept drafting off; a real change is followed over a few rounds."""
    return (1 - SMOOTHING) * scale + SMOOTHING * min(max(ratio, 0.5 * scale, 0.2), 2.0 * scale, 5.0)


def calibrate(target: Context, target_settings: ModelSettings, draft: Context | None,
              draft_settings: ModelSettings | None, token: int, *, refresh: bool = False) -> Costs:
    """The pair's cost model: from the cache when this pair, loaded this way on this machine,
    was measured before (unless ``refresh``), else measured now (a few seconds at most) and
    cached."""
    key = cache_key(target_settings, target.n_threads, draft_settings, draft.n_threads if draft is not None else 0)
    entry = _load_cache().get(key) if not refresh else None
    rollbacks = Rollbacks.of(target, draft)
    if entry is not None:
        t = _curve(entry.get("target"))
        d = _curve(entry.get("draft")) if draft is not None else None
        if t is not None and (draft is None or d is not None):
            return Costs(t, d, cached=True, rollbacks=rollbacks)
    t, t_ok = _measure_plausibly(target, TARGET_ROWS, token)
    d, d_ok = _measure_plausibly(draft, DRAFT_ROWS, token) if draft is not None else (None, True)
    if t_ok and d_ok:
        _store(key, t, d)  # a curve the machine's load bent is used now but measured again next time
    return Costs(t, d, rollbacks=rollbacks)


def _measure_plausibly(ctx: Context, rows: Sequence[int], token: int) -> tuple[Curve, bool]:
    """``measure_deep``, again (up to MEASURE_TRIES times) while the curve is not plausible (a busy
    machine made some sizes far dearer than they are); the last one bounded if it never is.
    The flag: a plausible curve was measured."""
    for _ in range(MEASURE_TRIES):
        curve = measure_deep(ctx, rows, token)
        if curve.plausible:
            return curve, True
    return curve.bounded(), False


def _store(key: str, target: Curve, draft: Curve | None) -> None:
    _store_entry(key, {"target": _entry(target), "draft": _entry(draft)})


def _store_entry(key: str, entry: dict[str, object]) -> None:
    with _file_lock:
        data = _load_cache()
        data.pop(key, None)
        data[key] = entry
        while len(data) > MAX_ENTRIES:  # the oldest entries go first
            data.pop(next(iter(data)))
        path = cache_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(path)
        except OSError:
            pass  # a read-only home: measure again next time


def slower_note(tokens_per_second: float, mean_drafted: float, mean_accepted: float, costs: Costs,
                auto: bool) -> str | None:
    """One line when a generation ran slower than the target alone would here (measured costs),
    saying why (draft cost and verification cost against one target decode) and what to try;
    None when it did not."""
    single = costs.host + costs.target(1)
    alone = 1.0 / single
    if tokens_per_second <= 0 or tokens_per_second >= 0.95 * alone or mean_drafted <= 0:
        return None
    rows = max(int(round(mean_drafted)) + 1, 2)
    advice = ("k auto was still exploring whether drafting pays on this text" if auto else
              "try --k auto (it drafts only where that pays)") + ", or --mode target"
    return (f"{tokens_per_second:.1f} tok/s is slower than the target alone would be here (~{alone:.1f} tok/s): "
            f"a drafted token costs {costs.draft(1) / single:.2f} of a target decode and verifying {rows} rows "
            f"costs {costs.target(rows) / costs.target(1):.1f} decodes, for {mean_accepted:.2f} tokens per round; "
            f"{advice}")


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


# -- rollbacks of recurrent and hybrid caches (fly_cpp.rollback) -----------------------------------

@dataclass
class Rollbacks:
    """What taking a round's caches back costs on a pair with a recurrent or hybrid model. A KV
    cache drops rejected rows for free; a recurrent state does not:

    - with checkpoints the target copies its state before every verification, and a round that
      keeps a of its h drafted tokens restores the copy and decodes the a + 1 kept rows again,
      in a pass of their own (llama.cpp's replay); snapshots cover rollbacks of up to
      ``n_rs_seq`` tokens for free, and only longer ones go the checkpoint's way;
    - a draft model copies its state once a round, and after a partial accept restores it and
      decodes the kept rows again: with checkpoints in a pass of their own, with snapshots in
      its first draft step's batch.

    Copies and restores are priced at what the contexts measured (``Ledger``: the calibration's
    rollbacks first, then every round's), re-decoded rows by the decode curves."""

    target_way: str
    target_depth: int
    target: rb.Ledger
    draft_way: str
    draft: rb.Ledger | None

    @staticmethod
    def of(target: Context, draft: Context | None) -> Rollbacks | None:
        ways = [c.rollback for c in (target, draft) if c is not None]
        if all(w == rb.KV for w in ways):
            return None
        return Rollbacks(target.rollback, target.n_rs_seq, target.rollbacks,
                         draft.rollback if draft is not None else rb.KV, draft.rollbacks if draft is not None else None)

    def round(self, costs: Costs, h: int, accept: float) -> float:
        if h <= 0:
            return 0.0
        t, d = self.target, self.draft
        free = self.target_depth if self.target_way == rb.SNAPSHOTS else 0  # rows snapshots drop for free
        seconds = t.copy_mean() if self.target_way != rb.KV and h > free else 0.0
        seconds += d.copy_mean() if d is not None and self.draft_way != rb.KV else 0.0
        p_kept = 1.0  # P(the first a drafted tokens are kept)
        for a in range(h):  # the round keeps exactly a < h of them
            p = p_kept * (1.0 - accept)
            if self.target_way != rb.KV and h - a > free:
                seconds += p * (t.restore_mean() + costs.target(a + 1))
            if d is not None and self.draft_way == rb.CHECKPOINTS:
                seconds += p * (d.restore_mean() + costs.draft(a + 1))
            elif d is not None and self.draft_way == rb.SNAPSHOTS:
                seconds += p * (d.restore_mean() + max(costs.draft(a + 2) - costs.draft(1), 0.0))
            p_kept *= accept
        return seconds

    def as_dict(self) -> dict[str, object]:
        return {"target": {"way": self.target_way, "copy_ms": round(self.target.copy_mean() * 1e3, 3),
                           "restore_ms": round(self.target.restore_mean() * 1e3, 3)},
                "draft": {"way": self.draft_way, "copy_ms": round(self.draft.copy_mean() * 1e3, 3),
                          "restore_ms": round(self.draft.restore_mean() * 1e3, 3)} if self.draft is not None else None}


@dataclass(frozen=True)
class RollbackWay:
    """What taking a recurrent or hybrid model's cache back costs one way, in milliseconds, over
    rounds like speculation's: decode 5 rows with logits, keep 2. A round takes the decode
    (snapshots also write the last rows' states; checkpoints copy the state before it, and after
    a restore decode the kept rows again first) and the drop (native, or restoring the copy)."""

    way: str
    round_ms: float
    drop_ms: float
    copy_ms: float
    restore_ms: float


def measure_rollbacks(model: Model, n_threads: int, rounds: int = 12, n_ubatch: int = 512) -> list[RollbackWay]:
    """Each way ``model``'s cache can go back (snapshots where llama.cpp keeps them for its
    architecture and the micro-batch holds them, then checkpoints), timed over ``rounds`` rounds
    after an untimed one, the ways taking turns (drift on a busy machine bends both alike), on
    small contexts of their own."""
    prompt = [max(model.bos, 0)] + list(range(100, 131))
    ctxs = []
    try:
        for way in (rb.SNAPSHOTS, rb.CHECKPOINTS):
            try:
                ctxs.append(Context(model, n_ctx=256, n_threads=n_threads, n_ubatch=n_ubatch, rollback=way))
            except FlyError:
                continue  # no snapshots here
            ctxs[-1].decode(prompt, logits="none")
        whole: list[list[float]] = [[] for _ in ctxs]
        drops: list[list[float]] = [[] for _ in ctxs]
        for i in range(rounds + 1):
            for ctx, w, d in zip(ctxs, whole, drops):
                t0 = perf_counter()
                ctx.decode(prompt[i % 5 + 1: i % 5 + 6], logits="all")
                t1 = perf_counter()
                ctx.truncate(len(ctx.tokens) - 3)
                t2 = perf_counter()
                if i:
                    w.append(t2 - t0)
                    d.append(t2 - t1)
        return [RollbackWay(ctx.rollback, statistics.median(w) * 1e3, statistics.median(d) * 1e3,
                            ctx.rollbacks.copy_mean() * 1e3, ctx.rollbacks.restore_mean() * 1e3)
                for ctx, w, d in zip(ctxs, whole, drops)]
    finally:
        for ctx in ctxs:
            ctx.close()


def pick_rollback(model: Model, settings: ModelSettings, threads: int) -> str:
    """The way a context of ``model`` goes back: as set, else (auto, on a recurrent or hybrid
    model) the cheaper of snapshots and checkpoints as measured here (``measure_rollbacks``),
    once per model, settings and machine (cached with the cost curves)."""
    if settings.rollback != "auto" or not model.recurrent:
        return settings.rollback
    key = "rollback-" + hashlib.sha256(json.dumps({"model": _identity(settings, threads), "on": _machine()},
                                                  sort_keys=True, default=str).encode()).hexdigest()[:32]
    way = _load_cache().get(key, {}).get("way")
    if way in (rb.SNAPSHOTS, rb.CHECKPOINTS):
        return str(way)
    ways = measure_rollbacks(model, threads, n_ubatch=settings.n_ubatch)
    if not ways:
        return "auto"
    best = cheaper(ways)
    _store_entry(key, {"way": best, "round_ms": {w.way: round(w.round_ms, 3) for w in ways}})
    return best


def cheaper(ways: Sequence[RollbackWay]) -> str:
    """The way to pick from measured ones. Snapshots save more in a generation than the probe
    shows (a draft's catch-up rides with its first step, where a checkpoint needs a decode of
    its own before it), so checkpoints must measure clearly cheaper to be picked."""
    return min(ways, key=lambda w: w.round_ms * (SNAPSHOT_EDGE if w.way == rb.SNAPSHOTS else 1.0)).way

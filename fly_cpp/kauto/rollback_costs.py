"""What taking recurrent and hybrid caches back costs (``fly_cpp.backend.rollback`` names the ways):
priced per round for k auto (``Rollbacks``), and measured per model to pick the cheaper way
(``pick_rollback``, cached with the cost curves)."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter

from fly_cpp.backend import rollback as rb
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import ModelSettings
from fly_cpp.kauto import costcache

SNAPSHOT_EDGE = 0.75  # snapshots are picked unless checkpoints measure cheaper than this share of them


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

    def round(self, target: Callable[[int], float], draft: Callable[[int], float], h: int, accept: float) -> float:
        """Seconds a round of ``h`` drafted tokens expects to spend going back; ``target`` and
        ``draft``: seconds of a decode by rows, now."""
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
                seconds += p * (t.restore_mean() + target(a + 1))
            if d is not None and self.draft_way == rb.CHECKPOINTS:
                seconds += p * (d.restore_mean() + draft(a + 1))
            elif d is not None and self.draft_way == rb.SNAPSHOTS:
                seconds += p * (d.restore_mean() + max(draft(a + 2) - draft(1), 0.0))
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
    key = "rollback-" + hashlib.sha256(json.dumps({"model": costcache.identity(settings, threads), "on": costcache.machine()},
                                                  sort_keys=True, default=str).encode()).hexdigest()[:32]
    way = costcache.load().get(key, {}).get("way")
    if way in (rb.SNAPSHOTS, rb.CHECKPOINTS):
        return str(way)
    ways = measure_rollbacks(model, threads, n_ubatch=settings.n_ubatch)
    if not ways:
        return "auto"
    best = cheaper(ways)
    costcache.store(key, {"way": best, "round_ms": {w.way: round(w.round_ms, 3) for w in ways}})
    return best


def cheaper(ways: Sequence[RollbackWay]) -> str:
    """The way to pick from measured ones. Snapshots save more in a generation than the probe
    shows (a draft's catch-up rides with its first step, where a checkpoint needs a decode of
    its own before it), so checkpoints must measure clearly cheaper to be picked."""
    return min(ways, key=lambda w: w.round_ms * (SNAPSHOT_EDGE if w.way == rb.SNAPSHOTS else 1.0)).way

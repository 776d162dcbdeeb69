"""How a context's cache goes back to an earlier position: the bookkeeping, without llama.cpp.

A transformer's KV cache drops any suffix (``KV``). A recurrent or hybrid model (Qwen3.5/3.6's
Gated DeltaNet, Mamba, LFM2, ...) keeps one running state per sequence, which cannot forget the
last tokens by itself. ``backend.cache.Cache`` (a ``Context``'s sequence, or one of a shared
context's several, ``Seq``) brings it back two ways:

- ``SNAPSHOTS``: llama.cpp keeps the states of the last ``n_rs_seq`` tokens of the last decode
  (``n_rs_seq`` at context creation, on the architectures that support it), and
  ``llama_memory_seq_rm`` then drops up to that many of that decode's tokens, once. It cannot
  drop a whole decode (the state before its first token is not kept), nor reach back past it.
- ``CHECKPOINTS``: a copy of the sequence's recurrent state (``llama_state_seq_get_data_ext``
  with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``) taken at position p; going back to n >= p
  restores it, drops the attention layers' cache after p, and decodes the tokens p..n again.
  The only way for a context with several sequences (snapshots serve one).

Anything else falls back to the nearest earlier checkpoint, or to an empty cache: never a wrong
state. The tokens a rollback must decode again are *deferred*: the context's token list says
they are there, and the next decode takes them in the same batch as its own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from fly_cpp.config.checks import ROLLBACK

KV = "kv"
SNAPSHOTS = "snapshots"
CHECKPOINTS = "checkpoints"
NONE = "none"  # a recurrent state llama.cpp can neither roll back nor copy: only a rebuild from empty
CHOICES = ROLLBACK  # what a user may ask for: "auto", SNAPSHOTS or CHECKPOINTS
SNAPSHOT_DEPTH = 8  # n_rs_seq: tokens a decode can drop natively (a state copy per token kept in memory)
RING = 3  # checkpoints kept for rounds and windows (each a copy of the recurrent state)
PINNED = 2  # ... and for the ends of prompts, which a later request's common prefix may reach back to


@dataclass
class Checkpoint:
    pos: int  # the cache held exactly the first ``pos`` tokens when this was taken
    data: Any  # the state's bytes (a ctypes array)
    pinned: bool = False


@dataclass
class Checkpoints:
    """The checkpoints of one sequence, newest last: ``RING`` of rounds and ``PINNED`` of prompts."""

    items: list[Checkpoint] = field(default_factory=list)

    def at(self, pos: int) -> Checkpoint | None:
        return next((c for c in self.items if c.pos == pos), None)

    def best(self, n: int) -> Checkpoint | None:
        """The latest checkpoint a rollback to ``n`` tokens can start from (pos <= n)."""
        return max((c for c in self.items if c.pos <= n), key=lambda c: c.pos, default=None)

    def add(self, checkpoint: Checkpoint) -> None:
        self.items = [c for c in self.items if c.pos != checkpoint.pos]
        self.items.append(checkpoint)
        for pinned, keep in ((False, RING), (True, PINNED)):
            mine = [c for c in self.items if c.pinned is pinned]
            for old in mine[: max(len(mine) - keep, 0)]:
                self.items.remove(old)

    def spare(self) -> Any:
        """The buffer of the checkpoint the next ``add`` of a round's checkpoint would evict
        (None: none would), to be written again rather than allocated anew."""
        ring = [c for c in self.items if not c.pinned]
        if len(ring) < RING:
            return None
        oldest = ring[0]
        self.items.remove(oldest)
        return oldest.data

    def drop_after(self, n: int) -> None:
        """Forget checkpoints past ``n`` tokens: the tokens after n are about to change."""
        self.items = [c for c in self.items if c.pos <= n]

    def clear(self) -> None:
        self.items = []


@dataclass
class Ledger:
    """What rollbacks cost one context so far: state copies taken and restored (count, seconds),
    native drops, rebuilds from empty, the tokens a rollback left to decode again, and the
    seconds of catch-up decodes split off so that a checkpoint could be taken between them and
    the decode's own rows (with snapshots those rows ride in one batch instead)."""

    copies: int = 0
    copy_seconds: float = 0.0
    restores: int = 0
    restore_seconds: float = 0.0
    native: int = 0
    rebuilds: int = 0
    redecoded: int = 0
    split_seconds: float = 0.0

    def copy_mean(self) -> float:
        return self.copy_seconds / self.copies if self.copies else 0.0

    def restore_mean(self) -> float:
        return self.restore_seconds / self.restores if self.restores else 0.0

    def since(self, before: Ledger) -> Ledger:
        return Ledger(*(getattr(self, f) - getattr(before, f) for f in self.__dataclass_fields__))

    def as_dict(self) -> dict[str, float | int]:
        return {"copies": self.copies, "copy_ms": round(self.copy_seconds * 1e3, 3), "restores": self.restores,
                "restore_ms": round(self.restore_seconds * 1e3, 3), "native": self.native,
                "rebuilds": self.rebuilds, "redecoded": self.redecoded,
                "split_ms": round(self.split_seconds * 1e3, 3)}


def marks(caches: dict[str, Any]) -> dict[str, tuple[Any, Ledger]]:
    """Each recurrent cache of ``caches`` (by role; a ``Context`` or ``Seq``, or None) with its
    ledger as a generation starts, for ``spent`` at its end."""
    return {role: (ctx, replace(ctx.rollbacks)) for role, ctx in caches.items()
            if ctx is not None and ctx.rollback != KV}


def spent(marked: dict[str, tuple[Any, Ledger]]) -> dict[str, object] | None:
    """What rollbacks cost each cache of ``marked`` since it was marked (None: none recurrent)."""
    return {role: {"way": ctx.rollback, **ctx.rollbacks.since(before).as_dict()}
            for role, (ctx, before) in marked.items()} or None

"""One sequence's KV cache and how it goes back: ``Cache``, shared by ``Context`` (a context of
its own) and ``Seq`` (one of a shared context's sequences), and the helpers their decodes share.

A cache keeps ``tokens``, the exact token at every position (position p holds ``tokens[p]``);
``decode`` appends, ``truncate`` rolls back, ``sync`` reuses the longest common prefix with a
new token list, and nothing else touches the cache, so that list is always the truth about it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

from fly_cpp.backend import rollback as rb
from fly_cpp.backend.lib import ll
from fly_cpp.basics.errors import CacheFull, FlyError

if TYPE_CHECKING:
    from fly_cpp.backend.model import Model


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):  # the shorter one whole: one copy, not two
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def decode_failed(name: str, rc: int, more: dict[int, str] | None = None) -> FlyError:
    """The error of a llama_decode that returned ``rc`` (``more``: a caller's own codes)."""
    if rc == 1 and not (more and 1 in more):
        return CacheFull(f"llama_decode failed on {name}: no KV slot: the context size has been exceeded "
                         "(the KV cache has no room for the batch)")
    what = {2: "aborted", **(more or {})}.get(rc, f"error {rc}")
    return FlyError(f"llama_decode failed on {name}: {what}")


def rows_wanted(held: int, n: int, n_ctx: int, n_batch: int, logits: str | int, n_outputs: int = 0) -> int:
    """How many of ``n`` new tokens a decode returns logits for (``logits``: "none", "last",
    "all" or a number), after checking that they fit the context (``held`` there already), that
    the rows asked for fit one batch, and that they are no more than the context's buffers hold
    (``n_outputs``; 0: no bound: llama.cpp asserts, ending the process, past it)."""
    if held + n > n_ctx:
        raise FlyError(f"context full: {held + n} tokens do not fit in n_ctx={n_ctx}")
    want = {"none": 0, "last": 1, "all": n}[logits] if isinstance(logits, str) else min(logits, n)
    if want > n_batch:
        raise ValueError("logits for every row need the tokens to fit one batch")
    if n_outputs and want > n_outputs:
        raise FlyError(f"a decode asked for logits of {want} rows where this engine holds {n_outputs} a "
                       f"sequence (load it for longer drafts: max_draft, the CLI's --k or --k-max)")
    return want


def chunks(lo: int, hi: int, n_batch: int) -> list[tuple[int, int]]:
    """Positions lo..hi-1 in batches of at most n_batch, the last one as full as they allow (it
    holds the rows with logits: a decode asks for at most n_batch of them); none when lo >= hi."""
    if lo >= hi:
        return []
    last = max(hi - n_batch, lo)
    starts = [*range(lo, last, n_batch), last]
    return list(zip(starts, [*starts[1:], hi]))


class Cache:
    """One sequence's cache and the one way it goes back, shared by ``Context`` (sequence 0 of a
    context of its own) and ``Seq`` (one of a context's several).

    ``tokens`` is the truth about the sequence: position p holds ``tokens[p]``. On a recurrent
    or hybrid model (``rollback`` SNAPSHOTS or CHECKPOINTS, ``fly_cpp.backend.rollback``) a rollback may
    leave the last few of them *deferred* (``behind``): restored from an earlier checkpoint, they
    are decoded again by the next decode, in the same batch as its own tokens. A subclass says
    how its tokens are decoded (``_decode_range``, ``_rows``) and how a call reaches llama.cpp
    (``_call``: at a moment no decode of the context runs), for its ``seq_id``."""

    model: Model
    ptr: Any
    seq_id: int
    n_rs_seq: int  # tokens a decode can drop natively (snapshots; 0: none kept)
    n_ctx: int
    n_batch: int
    n_outputs: int  # rows of logits one decode of this sequence may ask for (0: no bound)
    _memory: Any
    _call: Any

    def _track(self, rollback: str) -> None:
        """Start the bookkeeping of an empty sequence that goes back the ``rollback`` way."""
        self.rollback = rollback
        self.rollbacks = rb.Ledger()
        self.tokens: list[int] = []  # tokens[p] is the token at position p (the last ``behind`` deferred)
        self._done = 0  # tokens[:_done] are in the cache; the rest are deferred
        self._room = 0  # tokens the last decode can still drop natively (snapshots)
        self._checkpoints = rb.Checkpoints()
        self._intent: tuple[int, bool] | None = None  # (position, pinned): checkpoint there during the next decode

    def _decode_range(self, end: int, want: int) -> None:
        """Decode ``tokens[_done:end]`` at their positions, the last ``want`` rows with logits."""
        raise NotImplementedError

    def _rows(self, want: int) -> np.ndarray:
        """The last decode's ``want`` rows of logits, (want, n_vocab) float32."""
        raise NotImplementedError

    @property
    def can_rollback(self) -> bool:
        """Whether a suffix of the cache can be dropped without rebuilding it from empty."""
        return self.rollback != rb.NONE

    @property
    def behind(self) -> int:
        """Tokens of ``tokens`` a rollback left deferred: the next decode decodes them again."""
        return len(self.tokens) - self._done

    def decode(self, tokens: Sequence[int], logits: str | int = "last") -> np.ndarray | None:
        """Append ``tokens`` to the cache. ``logits``: "none", "last", "all", or a number n (the
        last n rows); the rows asked for must fit one batch (n_batch). Returns (rows, n_vocab)
        float32 (from a ``Context``: a view of llama.cpp's buffer, valid until it decodes again).
        Tokens are decoded in batches of n_batch, the last batch holding every row with logits,
        so that one call can both catch up and verify (deferred tokens go first)."""
        if not tokens:
            return None
        want = rows_wanted(len(self.tokens), len(tokens), self.n_ctx, self.n_batch, logits, self.n_outputs)
        start = len(self.tokens)
        if want > 1 and self._intent is None and self._needs_checkpoint(len(tokens)):
            self._intent = (start, False)  # a decode that checks several rows may be rolled back into
        self.tokens.extend(tokens)
        try:
            self._run(want)
        except BaseException:
            self.truncate(start)
            raise
        return self._rows(want) if want else None

    def _needs_checkpoint(self, n: int) -> bool:
        """Whether a rollback into a decode of ``n`` new tokens that keeps the first needs a
        checkpoint before it (snapshots reach back n_rs_seq tokens)."""
        return self.rollback == rb.CHECKPOINTS or (self.rollback == rb.SNAPSHOTS and n - 1 > self.n_rs_seq)

    def _run(self, want: int) -> None:
        """Decode the deferred and new tokens (``tokens[_done:]``), the last ``want`` with logits,
        taking the checkpoint asked for on the way."""
        end = len(self.tokens)
        intent, self._intent = self._intent, None
        if intent is not None:
            pos, pin = intent
            if not self._done <= pos <= end - want or self._checkpoints.at(pos) is not None:
                intent = None  # outside this decode (or splitting it would cut rows with logits), or there already
            elif pos > self._done and self.rollback == rb.SNAPSHOTS and end - pos <= min(self.n_rs_seq,
                                                                                      self._final_chunk(end) - 1):
                pass  # decoded whole; snapshots then reach back to pos
            else:
                if pos > self._done:  # catch up to pos alone (the decode a checkpoint costs)
                    t0 = perf_counter()
                    self._decode_range(pos, 0)
                    self.rollbacks.split_seconds += perf_counter() - t0
                self._copy(pin)
                intent = None
        self._decode_range(end, want)
        if intent is not None:  # back to the checkpoint's position natively; the rest is deferred
            pos, pin = intent
            self._drop(pos)
            self._copy(pin)

    def _final_chunk(self, end: int) -> int:
        return min(end - self._done, self.n_batch)

    def sync(self, committed: Sequence[int]) -> None:
        """Bring the cache to the speculative loop's invariant, reusing the longest common
        prefix: it holds every committed token but the last (``tokens == committed[:-1]``).
        A recurrent state is checkpointed there, for the next request's common prefix."""
        keep = common_prefix(self.tokens, committed[:-1])
        self.truncate(keep)
        self.decode(committed[keep:-1], logits="none")
        if self.behind:
            self._decode_range(len(self.tokens), 0)
        self.checkpoint(pin=True)

    def sync_through(self, committed: Sequence[int]) -> np.ndarray:
        """``sync``, but the last committed token is decoded too, in the same batch as what the
        cache lacked before it (as llama.cpp's own tools decode a prompt), and its (n_vocab,)
        logits row is returned (a view, valid until the next decode): the cache then holds all
        of ``committed``, and committing the token picked from that row restores the loop's
        invariant. KV caches only (a recurrent state would be checkpointed in the wrong place)."""
        if self.rollback != rb.KV:
            raise ValueError("sync_through needs a KV cache")
        keep = common_prefix(self.tokens, committed[:-1])
        self.truncate(keep)
        rows = self.decode(committed[keep:], logits="last")
        assert rows is not None
        return rows[0]

    def truncate(self, n: int) -> None:
        """Roll the cache back to its first ``n`` positions (``tokens`` is exactly
        ``tokens[:n]`` after; on a recurrent state some may be deferred)."""
        n = max(n, 0)
        if n < len(self.tokens):
            del self.tokens[n:]
        if self._intent is not None and self._intent[0] > n:
            self._intent = None
        if n < self._done:
            self._physical(n)

    @property
    def can_shift(self) -> bool:
        """Whether ``shift`` works here: a KV cache whose positions llama.cpp can move."""
        return self.rollback == rb.KV and bool(self._call(ll.llama_memory_can_shift, self._memory))

    def shift(self, keep: int, discard: int) -> None:
        """A context shift: drop positions keep..keep+discard-1 and move what follows down by
        ``discard`` (llama.cpp re-rotates the moved keys), so ``tokens`` loses that middle part
        and position p still holds ``tokens[p]`` (``can_shift`` must hold)."""
        end = len(self.tokens)
        if not (0 <= keep and 0 < discard and keep + discard <= end):
            raise ValueError(f"no shift of {discard} tokens after {keep} in a cache of {end}")
        if not self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, keep, keep + discard):
            raise FlyError(f"{self.model.name}: llama.cpp refused to drop positions {keep}..{keep + discard - 1}")
        self._call(ll.llama_memory_seq_add, self._memory, self.seq_id, keep + discard, end, -discard)
        del self.tokens[keep:keep + discard]
        self._done = len(self.tokens)

    def checkpoint(self, pos: int | None = None, *, pin: bool = False) -> None:
        """Make a later rollback to ``pos`` tokens (default: all of ``tokens``) cheap: nothing on
        a KV cache; on a recurrent state a copy of it there, taken now, or during the next
        decode when ``pos`` lies ahead (up to the tokens that decode appends), or by going back
        to ``pos`` with snapshots (what follows is then deferred). ``pin``: keep it past the
        rounds' checkpoints (the end of a prompt)."""
        if self.rollback not in (rb.SNAPSHOTS, rb.CHECKPOINTS):
            return
        pos = len(self.tokens) if pos is None else pos
        if (existing := self._checkpoints.at(pos)) is not None:
            existing.pinned = existing.pinned or pin
        elif pos == self._done:
            self._copy(pin)
        elif pos > self._done:
            self._intent = (pos, pin)
        elif self.rollback == rb.SNAPSHOTS and self._done - pos <= self._room and pos <= len(self.tokens):
            self._drop(pos)
            self._copy(pin)

    def _drop(self, n: int) -> None:
        """Drop the cache's tokens from ``n`` on natively (snapshots); they stay in ``tokens``, deferred."""
        if not self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, n, -1):
            raise FlyError(f"{self.model.name}: llama.cpp refused to drop {self._done - n} tokens it keeps snapshots for")
        self.rollbacks.native += 1
        self.rollbacks.redecoded += min(self._done, len(self.tokens)) - n
        self._done, self._room = n, 0
        self._checkpoints.drop_after(n)

    def _physical(self, n: int, failed: bool = False) -> None:
        """Bring the cache itself back to at most ``n`` tokens: exactly where the cache allows,
        else to the nearest checkpoint at or before n (or empty), the rest deferred. ``failed``:
        a decode failed, and a recurrent state may be anywhere past n."""
        self._checkpoints.drop_after(n)
        costs = self.rollbacks
        if self.rollback == rb.KV:
            if not self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, n, -1):
                raise FlyError(f"{self.model.name}: llama.cpp refused to roll sequence {self.seq_id} back to {n} tokens")
            self._done = n
            return
        if self.rollback == rb.SNAPSHOTS and not failed and self._done - n <= self._room:
            if self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, n, -1):
                costs.native += 1
                self._done, self._room = n, 0
                return
        self._room = 0
        best = self._checkpoints.best(n)
        if best is not None and self._restore(best):
            self._done = best.pos
        else:
            self._checkpoints.clear()
            self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, 0, -1)  # dropping everything always works
            costs.rebuilds += n > 0
            self._done = 0
        costs.redecoded += min(n, len(self.tokens)) - self._done

    def _copy(self, pin: bool = False) -> None:
        """Checkpoint the recurrent state as it is now (the cache holds ``tokens[:_done]``)."""
        t0 = perf_counter()
        partial = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = self._call(ll.llama_state_seq_get_size_ext, self.ptr, self.seq_id, partial)
        data = None if pin or self._checkpoints.at(self._done) else self._checkpoints.spare()
        if data is None or len(data) != size:
            data = (ctypes.c_uint8 * size)()
        if self._call(ll.llama_state_seq_get_data_ext, self.ptr, data, size, self.seq_id, partial) != size:
            return  # no checkpoint: a rollback here starts from an earlier one
        self._checkpoints.add(rb.Checkpoint(self._done, data, pin))
        self.rollbacks.copies += 1
        self.rollbacks.copy_seconds += perf_counter() - t0

    def _restore(self, checkpoint: rb.Checkpoint) -> bool:
        t0 = perf_counter()
        partial = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        data = checkpoint.data
        if self._call(ll.llama_state_seq_set_data_ext, self.ptr, data, len(data), self.seq_id, partial) != len(data):
            return False
        # the attention layers' cache still holds what came after: drop it
        if not self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, checkpoint.pos, -1):
            return False
        self.rollbacks.restores += 1
        self.rollbacks.restore_seconds += perf_counter() - t0
        return True

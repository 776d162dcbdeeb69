"""``Context``: one llama.cpp context over a model, with its KV cache and a reusable batch; one
sequence of its own, or several, each used through its view (``fly_cpp.backend.batch.Batcher.seq``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fly_cpp.backend import native
from fly_cpp.backend import rollback as rb
from fly_cpp.backend.cache import Cache, chunks, decode_failed, rows_wanted
from fly_cpp.backend.lib import (BATCH_MATCHES, clear_log, cxx, entry_point, flash_attention, ggml_type, last_log_error, ll,
                                 run_entry_points)
from fly_cpp.basics.errors import FlyError

if TYPE_CHECKING:
    from fly_cpp.backend.model import Model


_FLASH_ATTN = {"auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED}


class Context(Cache):
    """One llama.cpp context over a model: a KV cache for sequence 0 and a reusable batch.

    ``tokens`` is the truth about the cache: position p holds ``tokens[p]``; a rollback of a
    recurrent or hybrid model may leave the last few deferred (``Cache``). A context made with
    ``n_seq`` > 1 is used only through its sequences' views (``fly_cpp.backend.batch.Batcher``)."""

    def __init__(self, model: Model, *, n_ctx: int, n_threads: int, n_batch: int = 512, n_ubatch: int = 512,
                 type_k: str = "f16", type_v: str = "f16", flash_attn: str = "auto", precise: bool = False,
                 rollback: str = "auto", n_seq: int = 1, kv_unified: bool = False, n_outputs: int = 0,
                 branches: bool = False) -> None:
        """``n_ctx``: tokens the context holds (llama.cpp rounds its cache up to a multiple of
        256; the context still holds only ``n_ctx``). ``type_k``/``type_v``: KV cache types
        ("f16", "q8_0", ...); ``flash_attn``: "on", "off" or "auto". ``precise``: an F32 KV cache
        and no flash attention, so that logits match a float64 reference forward pass to ~1e-5
        (for checking converted models; slower). ``rollback`` (recurrent and hybrid models):
        "snapshots", "checkpoints", or "auto" (snapshots where llama.cpp keeps them for the
        architecture and the micro-batch holds them, else checkpoints). ``n_seq`` > 1: that many
        sequences, used only through their views (``seq``), each with n_ctx / n_seq cells of its
        own (as llama-server's slots), or all sharing the n_ctx cells of one cache
        (``kv_unified``); a recurrent state then goes back by checkpoints, each sequence's own
        (llama.cpp's snapshots would serve one sequence's rounds only). ``n_outputs``: rows of
        logits one sequence's decode asks for at most (its longest verification); llama.cpp's
        compute buffer holds that many for every sequence at once (0: n_batch rows, 300 MiB a
        context with a 151,936-token vocabulary and n_batch 512, where llama-server sizes its
        contexts by its draft length: 17 rows a sequence). ``branches``: a KV cache of one sequence
        that a tree's verification may fork for one decode (``decode_tree``): llama.cpp's cache
        then knows two sequences in the same cells (``kv_unified``), the second only for that;
        where llama.cpp runs no flash attention the context has no branches (``branches`` False)."""
        self.model = model
        recurrent = model.recurrent
        if recurrent and n_seq > 1 and rollback == rb.SNAPSHOTS:
            raise FlyError(f"{model.name}: rollback by snapshots serves one sequence; with several (--parallel > 1) "
                           "use rollback 'checkpoints' or 'auto'")
        # llama.cpp caps the batch at the context; so does the batch allocated here, which
        # otherwise holds n_batch entries whatever the context (a huge n_batch: an OOM kill, or
        # seconds of allocating); n_ctx 0 is the model's own context length
        n_batch = max(1, min(n_batch, n_ctx or model.n_ctx_train or n_batch))
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = max(1, min(n_batch, n_ubatch))
        branches = branches and n_seq == 1 and not recurrent
        params.n_seq_max = 2 if branches else max(1, n_seq)
        # llama.cpp sizes its compute buffer for a decode with this many rows of logits, and asserts
        # (ending the process) on a decode that asks for more: ``rows_wanted`` refuses one first
        params.n_outputs_max = min(n_batch, max(1, n_seq) * n_outputs) if n_outputs > 0 else 0
        params.kv_unified = (n_seq > 1 and kv_unified) or branches
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        params.type_k, params.type_v = ggml_type(type_k), ggml_type(type_v)
        params.flash_attn_type = _FLASH_ATTN[flash_attn]
        if precise:
            params.type_k = params.type_v = ll.GGML_TYPE_F32
            params.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        # llama.cpp keeps a decode's last n_rs_seq + 1 tokens in one micro-batch (it asserts on less)
        if recurrent and n_seq == 1 and rollback != rb.CHECKPOINTS and params.n_ubatch > rb.SNAPSHOT_DEPTH + 1:
            params.n_rs_seq = rb.SNAPSHOT_DEPTH
        elif recurrent and rollback == rb.SNAPSHOTS:
            raise FlyError(f"{model.name}: rollback by snapshots needs n_ubatch > {rb.SNAPSHOT_DEPTH + 1} "
                           f"(got {params.n_ubatch}); use rollback 'checkpoints' or 'auto'")
        clear_log()
        self._call = model.call
        self.ptr = self._call(ll.llama_init_from_model, model.ptr, params)
        if not self.ptr:
            reason = last_log_error()
            raise FlyError(f"llama.cpp could not create a context for {model.name}" + (f": {reason}" if reason else ""))
        self.n_ctx: int = min(n_ctx, ll.llama_n_ctx(self.ptr)) if n_ctx > 0 else ll.llama_n_ctx(self.ptr)
        self.n_batch = min(n_batch, ll.llama_n_batch(self.ptr))  # llama.cpp caps n_batch at n_ctx
        self.n_ubatch: int = ll.llama_n_ubatch(self.ptr)
        self.n_outputs = min(n_outputs, self.n_batch) if n_outputs > 0 else 0  # a sequence's (``rows_wanted``)
        self.n_threads: int = ll.llama_n_threads(self.ptr)
        self._memory = ll.llama_get_memory(self.ptr)
        self._batch = ll.llama_batch_init(self.n_batch, 0, 2 if branches else 1)
        # numpy views of the batch's columns: a decode fills them by slices, not entry by entry
        b, n = self._batch, self.n_batch
        self._columns = tuple(np.ctypeslib.as_array(c, shape=(n,)) for c in (b.token, b.pos, b.n_seq_id, b.logits))
        self._logits: tuple[int, int, np.ndarray] | None = None  # (address, rows, the view) last read
        self.seq_id = 0  # the sequence this context's own ``tokens`` and rollbacks are about
        self.n_rs_seq = ll.llama_n_rs_seq(self.ptr) if recurrent else 0
        self._track(self._rollback_kind(recurrent))
        if recurrent and rollback == rb.SNAPSHOTS and self.rollback != rb.SNAPSHOTS:
            self.close()
            raise FlyError(f"{model.name}: llama.cpp keeps no recurrent-state snapshots for its architecture; "
                           "use rollback 'checkpoints' or 'auto'")
        self._hidden: np.ndarray | None = None  # (positions, n_embd): the target's hidden state at each position (MTP)
        self._hidden_valid = 0  # rows of _hidden that hold the state after tokens[:p + 1]
        self.n_seq = max(1, n_seq)
        self.kv_unified = params.kv_unified
        # llama.cpp's attention without flash attention mixes a forked cache's sequences (a branch's rows
        # off by 0.3-0.6 in the logits on the Qwen2.5 pair); with it, each row is its path's own
        self.branches = branches and flash_attention()
        self._fork = False  # a tree's branch is in sequence 1 (``decode_tree``)
        self._drafting: dict[tuple[int, int], native.DraftContext] = {}  # (n_vocab, seq) -> what a draft run decodes in

    def keep_hidden(self) -> None:
        """Record, from now on, the hidden state every decoded position ends with (what an MTP
        head reads: ``hidden``). Costs a copy of n_embd floats per decoded token."""
        if self._hidden is None:
            cxx("llama_set_embeddings_nextn")(self.ptr, True, False)  # every row, not only those with logits
            self._hidden = np.zeros((0, self.model.n_embd), dtype=np.float32)
            self._hidden_valid = 0

    def hidden(self, lo: int, hi: int) -> np.ndarray:
        """The hidden states of positions lo..hi-1 (``keep_hidden``), each the state after the
        tokens up to and including that position; the rows must have been decoded."""
        if self._hidden is None or hi > self._hidden_valid or lo < 0:
            raise FlyError(f"no hidden state recorded for positions {lo}..{hi - 1} (have {self._hidden_valid})")
        return self._hidden[lo:hi]

    def _record_hidden(self, lo: int, hi: int) -> None:
        if self._hidden is None:
            return
        rows = np.ctypeslib.as_array(cxx("llama_get_embeddings_nextn")(self.ptr), shape=(hi - lo, self._hidden.shape[1]))
        if hi > len(self._hidden):
            grown = np.zeros((max(hi, 2 * len(self._hidden), 256), self._hidden.shape[1]), dtype=np.float32)
            grown[: len(self._hidden)] = self._hidden
            self._hidden = grown
        self._hidden[lo:hi] = rows
        if lo <= self._hidden_valid:
            self._hidden_valid = max(self._hidden_valid, hi)

    def _rollback_kind(self, recurrent: bool) -> str:
        if not recurrent:
            return rb.KV
        if self.n_rs_seq > 0:
            return rb.SNAPSHOTS
        partial = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        if self._memory and self._call(ll.llama_state_seq_get_size_ext, self.ptr, 0, partial) > 0:
            return rb.CHECKPOINTS
        return rb.NONE

    def _decode_range(self, end: int, want: int) -> None:
        tokens = self.tokens
        for lo, hi in chunks(self._done, end, self.n_batch):
            self.fill_batch(0, tokens[lo:hi], lo, 0, hi - max(end - want, lo))
            rc = self._call(ll.llama_decode, self.ptr, self._batch)
            if rc != 0:
                self._physical(lo, failed=True)  # a failed decode may leave part of the chunk behind
                raise decode_failed(self.model.name, rc)
            self._done = hi
            self._room = min(self.n_rs_seq, hi - lo - 1)
            self._record_hidden(lo, hi)

    def fill_batch(self, at: int, tokens: Sequence[int], pos: int, seq: int, want: int) -> int:
        """Put ``tokens`` in the batch from its entry ``at``: positions ``pos``.., sequence ``seq``,
        logits for the last ``want`` of them. The batch then holds entries 0..end (returned)."""
        token, position, n_seq_id, logits = self._columns
        end = at + len(tokens)
        token[at:end] = tokens
        position[at:end] = np.arange(pos, pos + end - at, dtype=np.int32)
        n_seq_id[at:end] = 1
        logits[at:end] = 0
        logits[max(end - want, at):end] = 1
        seq_id = self._batch.seq_id
        for i in range(at, end):
            seq_id[i][0] = seq
        self._batch.n_tokens = end
        return end

    def _rows(self, want: int) -> np.ndarray:
        address = ctypes.cast(self._call(ll.llama_get_logits, self.ptr), ctypes.c_void_p).value
        last = self._logits
        if last is None or last[0] != address or last[1] != want:  # llama.cpp's buffer moved, or other rows
            view = np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_float)),
                                         shape=(want, self.model.n_vocab))
            last = self._logits = (address, want, view)
        return last[2]

    def truncate(self, n: int) -> None:
        """Roll the cache back to its first ``n`` positions (``tokens`` is exactly
        ``tokens[:n]`` after; on a recurrent state some may be deferred). A tree's branch is dropped."""
        self._hidden_valid = min(self._hidden_valid, max(n, 0))
        self._drop_branch()
        super().truncate(n)

    def decode_tree(self, tokens: Sequence[int], fork: int, branch: Sequence[int], want: int) -> np.ndarray:
        """Decode a tree in one batch (``branches`` must hold): ``tokens`` appended to the cache as
        ``decode`` appends them, the last ``want`` of them with logits, and ``branch``, a second
        continuation whose first token stands where ``tokens[fork]`` stands, attending to
        ``tokens[:fork]`` and not to the rest, every one with logits. Returns those rows,
        ``tokens``' then ``branch``'s (a view of llama.cpp's buffer). The branch lives in a second
        sequence of the same cells (the prefix's cells are shared with it, not copied) until the
        next ``truncate``, which drops it: its cells are never kept. A kept branch's cells would
        lie after the chain's freed ones, and llama.cpp's attention over cells out of their
        positions' order is off (0.2-0.3 in the logits on the Qwen2.5 pair, not rounding): a
        branch the target took is decoded again in order, in the next round's batch."""
        start, n, m = len(self.tokens), len(tokens), len(branch)
        if not self.branches or self.behind or self._intent is not None or not 0 < fork < n or not m \
                or not n - fork < want <= n:  # the rows from before the fork on
            raise ValueError("no tree decode here")
        rows_wanted(start, n + m, self.n_ctx, self.n_batch, want + m, self.n_outputs)  # its cells, its rows
        self._drop_branch()
        memory = self._memory
        if start:
            self._call(ll.llama_memory_seq_cp, memory, 0, 1, 0, start)
        self.fill_batch(0, tokens, start, 0, want)
        self.fill_batch(n, branch, start + fork, 1, m)
        n_seq_id, seq_id = self._columns[2], self._batch.seq_id
        n_seq_id[:fork] = 2
        for i in range(fork):
            seq_id[i][1] = 1
        self._fork = True
        rc = self._call(ll.llama_decode, self.ptr, self._batch)
        if rc != 0:
            self._drop_branch()
            self._physical(start, failed=True)
            raise decode_failed(self.model.name, rc)
        self.tokens.extend(tokens)
        self._done = len(self.tokens)
        return self._rows(want + m)

    def _drop_branch(self) -> None:
        if self._fork:
            self._fork = False
            self._call(ll.llama_memory_seq_rm, self._memory, 1, -1, -1)

    def shift(self, keep: int, discard: int) -> None:
        self._hidden_valid = min(self._hidden_valid, keep)  # the moved positions' states are not moved
        super().shift(keep, discard)

    @property
    def runs_natively(self) -> bool:
        """Whether ``greedy_run`` can decode here: a plain KV cache of one sequence on this
        machine (no rpc servers), no hidden states kept, and the native library has runs."""
        return (self.rollback == rb.KV and self.n_seq == 1 and self._hidden is None
                and not self.model.call.endpoints and BATCH_MATCHES and native.has_greedy_run())

    def greedy_run(self, token: int, n: int, stop: np.ndarray | None) -> list[int]:
        """Target-only greedy decoding without returning to Python per token (``runs_natively``
        must hold): decode ``token`` (appended to ``tokens``), take its row's argmax (lowest id
        on ties, as ``rows.argmax``), decode that, ... up to ``n`` tokens, or through the first
        one marked in ``stop`` ((n_vocab,) uint8). Returns the tokens picked; every one but the
        last has been decoded after ``token``, so ``tokens`` ends with all but the last of them."""
        start = len(self.tokens)
        n = min(n, self.n_ctx - start)
        if n <= 0 or self.behind or self._intent is not None:
            raise FlyError(f"no room for a greedy run at {start} of n_ctx={self.n_ctx}")
        decode, logits = run_entry_points()
        got, status = native.greedy_run(decode, logits, self.ptr, ctypes.addressof(self._batch), token, start, 0,
                                        self.model.n_vocab, stop, n)
        self.tokens.extend([token, *got[:-1]] if got else [])
        self._done = len(self.tokens)
        if status != 0:
            self._physical(len(self.tokens), failed=True)
            raise decode_failed(self.model.name, status, {-1: "no logits"})  # -1: the run's own
        return got

    @property
    def drafts_natively(self) -> bool:
        """Whether ``draft_run`` can decode here (``runs_natively``'s conditions, and the native
        library has draft runs)."""
        return self.runs_natively and native.has_draft_run()

    def draft_run(self, hist: np.ndarray, n_hist: int, rules: native.DraftRules, n_vocab: int,
                  cache: Cache | None = None, text: Sequence[int] | None = None) -> tuple[list[int], list[float], int]:
        """A round of drafting (the argmax, or the shared draw the rules carry) without returning to
        Python per token (``drafts_natively`` must hold; ``native.draft_run`` says what it does) in ``cache`` (this context's own
        sequence, or one of its ``Seq`` views): the text is ``hist[:n_hist]``, of which the
        cache's ``tokens`` must be a prefix, shorter than it (the rest, the catch-up, is decoded
        with the first step). Returns (the drafted tokens, their confidences when asked, the
        draft's own token after ``tokens``); ``tokens`` then holds the text and all drafted
        tokens but the last (fewer where the draft lost confidence in a guess). ``text``: the
        caller's list of ``hist[:n_hist]``, whose int objects ``tokens`` then shares (comparing
        the cache with the text each round then meets its elements by identity: on 3,500 tokens
        4 us, where equal ints made apart take 54)."""
        cache = self if cache is None else cache
        start = len(cache.tokens)
        if start >= n_hist or cache.behind or cache._intent is not None or n_hist + rules.limit - 1 > cache.n_ctx:
            raise FlyError(f"no room for a draft run at {start} of n_ctx={cache.n_ctx}")
        where = self._drafting.get((n_vocab, cache.seq_id))
        if where is None:
            decode, logits = run_entry_points()
            where = self._drafting[n_vocab, cache.seq_id] = native.DraftContext(
                decode, logits, entry_point("llama_memory_seq_rm"), self.ptr, self._memory,
                ctypes.addressof(self._batch), self.n_batch, cache.seq_id, self.model.n_vocab, n_vocab,
                self.model.eog_mask.ctypes.data)
        out, conf, done, last, status = native.draft_run(where, rules, hist, n_hist, start)
        decoded = hist[start:done].tolist()
        if text is not None:
            shared = [*text[start:min(done, n_hist)], *out[:max(done - n_hist, 0)]]
            if shared == decoded:
                decoded = shared
        cache.tokens.extend(decoded)
        cache._done = len(cache.tokens)
        if status != 0:
            cache._physical(len(cache.tokens), failed=True)
            if status == -3:
                raise FlyError(f"{self.model.name}: llama.cpp refused to roll the KV cache back")
            if status == -2:
                raise ValueError("bad draft run arguments")
            if status == -4:
                raise MemoryError("a sampled draft draw ran out of memory")
            raise decode_failed(self.model.name, status, {-1: "no logits"})
        return out, conf, last

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self._logits = None
            ll.llama_batch_free(self._batch)
            self._call.release(ll.llama_free, self.ptr)
            self.ptr = None
            self._checkpoints = rb.Checkpoints()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

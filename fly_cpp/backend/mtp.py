"""``MtpContext``: the context of a model's MTP head, bound to the target's context.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fly_cpp.backend.lib import clear_log, cxx, last_log_error, ll
from fly_cpp.basics.errors import FlyError

if TYPE_CHECKING:
    from fly_cpp.backend.context import Context


class MtpContext:
    """The context of a model's MTP head, bound to the target's context (llama.cpp's
    ``LLAMA_CONTEXT_TYPE_MTP`` with ``ctx_other``): its own KV cache for the MTP layer, where
    position p holds token p paired with the target's hidden state after position p - 1.
    ``tokens`` is the truth about that cache, as ``Context.tokens`` is for the target's; the
    target records its hidden states (``Context.keep_hidden``) from here on."""

    def __init__(self, target: Context) -> None:
        model = target.model
        if not model.mtp_loaded:
            raise FlyError(f"{model.name} has no MTP layers (draft-mtp needs a model that keeps its MTP head)")
        target.keep_hidden()
        params = ll.llama_context_default_params()
        params.n_ctx = target.n_ctx
        params.n_batch = params.n_ubatch = target.n_batch
        params.n_seq_max = 1
        params.n_rs_seq = 0
        params.n_threads = params.n_threads_batch = target.n_threads
        params.no_perf = True
        params.ctx_type = ll.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target.ptr
        clear_log()
        self.target, self.model, self.n_batch = target, model, target.n_batch
        self.ptr = model.call(ll.llama_init_from_model, model.ptr, params)
        if not self.ptr:
            reason = last_log_error()
            raise FlyError(f"llama.cpp could not create an MTP context for {model.name}" + (f": {reason}" if reason else ""))
        # the head's own state at every row: masked (rows with logits only), a batch of several
        # tokens gave its first row's state in place of the last one's
        cxx("llama_set_embeddings_nextn")(self.ptr, True, False)
        self._memory = ll.llama_get_memory(self.ptr)
        self._batch = ll.llama_batch_ext_init(self.ptr)
        self._pos = ll.llama_pos(0)
        self.n_embd = model.n_embd
        self.tokens: list[int] = []
        self.exact = 0  # tokens[:exact] are paired with the target's own states (the rest with the head's)

    def decode(self, tokens: Sequence[int], states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append ``tokens``, each with the hidden state it pairs with (``states``: one row per
        token), in one batch; returns the last row's logits (n_vocab,) and the head's hidden
        state there (n_embd,), copies."""
        n = len(tokens)
        if not 0 < n <= self.n_batch or states.shape != (n, self.n_embd):
            raise ValueError(f"an MTP batch needs 1..{self.n_batch} tokens with one state each")
        if len(self.tokens) + n > self.target.n_ctx:
            raise FlyError(f"context full: {len(self.tokens) + n} tokens do not fit in n_ctx={self.target.n_ctx}")
        states = np.ascontiguousarray(states, dtype=np.float32)
        batch, start = self._batch, len(self.tokens)
        ll.llama_batch_ext_clear(batch)
        row = ctypes.POINTER(ctypes.c_float)
        for i, token in enumerate(tokens):
            idx = ll.llama_batch_ext_add_token(batch, 0, int(token))
            self._pos.value = start + i
            embd = ll.llama_embd(ctypes.cast(states.ctypes.data + i * 4 * self.n_embd, row), 1, self.n_embd)
            if idx < 0 or not (ll.llama_batch_ext_set_pos(batch, idx, ctypes.byref(self._pos))
                               and ll.llama_batch_ext_set_embd_token(batch, idx, embd)
                               and ll.llama_batch_ext_set_output_logits(batch, idx, i == n - 1)):
                raise FlyError(f"llama.cpp refused an MTP batch entry for {self.model.name}")
        rc = self.model.call(ll.llama_process, self.ptr, ll.LLAMA_PROCESS_TYPE_DECODE, batch)
        if rc != 0:
            self.truncate(start)
            raise FlyError(f"llama_process failed on {self.model.name}'s MTP head: error {rc}")
        self.tokens.extend(int(t) for t in tokens)
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ptr, n - 1), shape=(self.model.n_vocab,))
        hidden = np.ctypeslib.as_array(cxx("llama_get_embeddings_nextn_ith")(self.ptr, n - 1), shape=(self.n_embd,))
        return logits.copy(), hidden.copy()

    def paired(self, n: int) -> None:
        """The first ``n`` tokens are paired with the target's own states now."""
        self.exact = n

    def truncate(self, n: int) -> None:
        """Drop the cache's positions from ``n`` on (a plain KV cache: always exact)."""
        n = max(n, 0)
        self.exact = min(self.exact, n)
        if n < len(self.tokens):
            ll.llama_memory_seq_rm(self._memory, 0, n, -1)
            del self.tokens[n:]

    def close(self) -> None:
        if getattr(self, "ptr", None):
            ll.llama_batch_ext_free(self._batch)
            self.model.call.release(ll.llama_free, self.ptr)
            self.ptr = None

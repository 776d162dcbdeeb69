"""``n_probs``: the target's top-n probabilities at each generated token.

The rounds of a generation see the target's logits only a batch at a time and keep none of
them, so the probabilities are computed afterwards by one teacher-forced target pass over the
output (the same pass ``fly_cpp.bench.fidelity`` makes): prompt + output are decoded in batches
of n_batch with logits for every row, reusing the cached common prefix. It costs about one
prompt-processing pass over the output, not a generation. The values are the target's own
distribution (softmax of its raw logits, before sampling settings), as llama-server reports
with ``post_sampling_probs`` off; under FLy a loosely accepted token shows how unlikely the
target found it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fly_cpp.drafters import common_prefix
from fly_cpp.engine import Engine
from fly_cpp.rows import log_softmax


def top_logprobs(engine: Engine, prompt: Sequence[int], output: Sequence[int], n: int) -> list[dict[str, Any]]:
    """One entry per output token: its id, text, bytes and logprob, and the n most likely."""
    if not output or n <= 0:
        return []
    model, ctx = engine.target_model, engine.target
    seq = [*prompt, *output]
    start = len(prompt) - 1  # the row whose logits predict output[0]
    out: list[dict[str, Any]] = []
    with engine._lock:  # between generations; the next one re-syncs its caches by common prefix
        pos = min(common_prefix(ctx.tokens, seq), start)
        ctx.truncate(pos)
        while pos < len(seq) - 1:  # the last token predicts nothing we need
            chunk = seq[pos: min(pos + ctx.n_batch, len(seq) - 1)]
            logits = ctx.decode(chunk, logits="all")  # (len(chunk), n_vocab) view, valid until the next decode
            lo = max(start - pos, 0)
            if lo < len(chunk):
                logp = log_softmax(np.asarray(logits[lo:], dtype=np.float32))  # (rows, n_vocab)
                for row, token in zip(logp, seq[pos + lo + 1: pos + len(chunk) + 1]):
                    top = np.argpartition(-row, min(n, len(row) - 1))[:n]
                    top = top[np.argsort(-row[top], kind="stable")]
                    entry = _token(model, int(token), float(row[token]))
                    entry["top_logprobs"] = [_token(model, int(t), float(row[t])) for t in top]
                    out.append(entry)
            pos += len(chunk)
    return out


def _token(model: Any, token: int, logprob: float) -> dict[str, Any]:
    piece = model.piece(token)
    return {"id": token, "token": piece.decode("utf-8", "replace"), "bytes": list(piece), "logprob": logprob}

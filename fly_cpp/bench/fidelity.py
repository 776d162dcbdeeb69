"""Fidelity: how far a mode's output is from what the target alone writes.

- ``agreement``: the share of positions where the two token sequences hold the same token
  (over the longer of the two, so a shorter or longer output counts its extra positions as
  disagreements), and the first position where they differ (None when identical).
- ``target_nll``: the target's mean negative log-likelihood (nats per token) of an output,
  teacher-forced after the prompt. It says how much worse the target finds a text; the
  target's own greedy output is the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fly_cpp._llama import Context
from fly_cpp.drafters import common_prefix


def agreement(tokens: Sequence[int], reference: Sequence[int]) -> tuple[float, int | None]:
    n = max(len(tokens), len(reference))
    if n == 0:
        return 1.0, None
    a = np.asarray(tokens[: len(reference)], dtype=np.int64)
    b = np.asarray(reference[: len(tokens)], dtype=np.int64)
    same = a == b  # (min(len),)
    first = int(np.argmin(same)) if not same.all() else (None if len(tokens) == len(reference) else len(same))
    return float(same.sum()) / n, first


def _row_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] per row; logits (rows, n_vocab) float32, targets (rows,)."""
    x = logits.astype(np.float64)
    top = x.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(x - top).sum(axis=1))
    return lse - x[np.arange(len(targets)), targets]


def target_nll(ctx: Context, prompt: Sequence[int], output: Sequence[int]) -> float | None:
    """Mean NLL of ``output`` after ``prompt`` under the model of ``ctx``.

    Reuses the common prefix of the KV cache, decodes the rest in chunks of n_batch with
    logits for every row, and leaves the cache holding prompt + output: the engine re-syncs
    its caches by common prefix before each generation, so this is safe between generations.
    """
    if not output:
        return None
    seq = [*prompt, *output]
    if len(seq) > ctx.n_ctx:
        seq = seq[: ctx.n_ctx]
    start = len(prompt) - 1  # row of the logits predicting output[0]
    keep = min(common_prefix(ctx.tokens, seq), start)
    ctx.truncate(keep)
    nll: list[np.ndarray] = []
    pos = keep
    while pos < len(seq):
        chunk = seq[pos : pos + ctx.n_batch]
        logits = ctx.decode(chunk, logits="all")  # (len(chunk), n_vocab), row i predicts seq[pos+i+1]
        lo, hi = max(start, pos), min(pos + len(chunk), len(seq) - 1)
        if hi > lo:
            rows = logits[lo - pos : hi - pos]
            nll.append(_row_nll(rows, np.asarray(seq[lo + 1 : hi + 1], dtype=np.int64)))
        pos += len(chunk)
    values = np.concatenate(nll) if nll else np.zeros(0)
    return float(values.mean()) if len(values) else None

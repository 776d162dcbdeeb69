"""Per-row reductions over logits: argmax, top-3 entropy, top probability.

These are the numpy reference implementations. Inputs are (rows, n_vocab) float32 arrays,
usually zero-copy views of llama.cpp's logits buffer (valid only until the next decode).
"""

from __future__ import annotations

import numpy as np


def argmax(logits: np.ndarray) -> np.ndarray:
    """(rows, V) float32 -> (rows,) int64: the greedy token of each row (lowest id on ties)."""
    return np.argmax(logits, axis=-1)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(rows, V) -> (rows, V) float64 log-probabilities."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return x


def top_entropy(logits: np.ndarray, top: int = 3) -> np.ndarray:
    """(rows, V) -> (rows,) float64: FLy's top-k entropy, -sum exp(l_i) * l_i over the k
    largest log-probabilities of the full softmax (not renormalised over the top k)."""
    x = np.asarray(logits, dtype=np.float32)
    peak = x.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(x - peak).sum(axis=-1, keepdims=True, dtype=np.float64)) + peak
    top_k = min(top, x.shape[-1])
    best = np.partition(x, x.shape[-1] - top_k, axis=-1)[..., -top_k:].astype(np.float64) - lse
    return -(np.exp(best) * best).sum(axis=-1)


def top_probability(logits: np.ndarray) -> np.ndarray:
    """(rows, V) -> (rows,) float64: the softmax probability of each row's greedy token."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return 1.0 / np.exp(x).sum(axis=-1)

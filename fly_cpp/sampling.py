"""Sampling the target: llama.cpp's chain, seeded, and the two rules for sampled verification.

Chain order follows llama.cpp's default sampler: penalties -> top-k -> top-p -> min-p ->
temperature -> draw. Temperature 0 is greedy (argmax after penalties).

How sampled rounds are verified (lossless rejection sampling for ``spd``, the authors'
two-draw rule for ``fly``) is ``fly_cpp.verify``'s business; this module only draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fly_cpp import native
from fly_cpp.config import SamplingSettings
from fly_cpp.rows import argmax


class Sampler:
    """Target-side token choice for one generation (holds that generation's RNG)."""

    def __init__(self, settings: SamplingSettings, seed: int) -> None:
        self.settings = settings
        self.rng = np.random.default_rng(seed)

    def penalise(self, row: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """(V,) logits -> (V,) penalised copy, llama.cpp's repeat/presence/frequency rules."""
        s = self.settings
        if not s.penalised or not history:
            return row
        recent = np.asarray(history[-s.repeat_last_n:], dtype=np.int64)
        ids, counts = np.unique(recent[recent < row.shape[0]], return_counts=True)
        out = np.array(row, dtype=np.float32, copy=True)
        vals = out[ids]
        vals = np.where(vals > 0, vals / s.repeat_penalty, vals * s.repeat_penalty)
        vals -= counts * s.frequency_penalty + s.presence_penalty
        out[ids] = vals
        return out

    def greedy(self, rows: np.ndarray, histories: Callable[[int], Sequence[int]]) -> np.ndarray:
        """(n, V) -> (n,) argmax per row, after penalties (row i sees ``histories(i)``)."""
        if not self.settings.penalised:
            return argmax(rows)
        return np.array([int(argmax(self.penalise(rows[i], histories(i))[None])[0]) for i in range(rows.shape[0])])

    def distribution(self, row: np.ndarray, history: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(V,) logits -> (ids (n,) int64, probs (n,) float64) after the whole chain; ids in
        order of logit, lowest id first on ties."""
        x = self.penalise(row, history)
        s = self.settings
        if s.temperature > 0 and native.accepts_row(x):
            return native.distribution(x, s.temperature, s.top_k, s.top_p, s.min_p)
        return self._chain_numpy(x)

    def distribution_numpy(self, row: np.ndarray, history: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The numpy reference of ``distribution``."""
        return self._chain_numpy(self.penalise(row, history))

    def _chain_numpy(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = self.settings
        x = row.astype(np.float64)  # (V,)
        n = x.shape[0]
        keep_k = s.top_k if 0 < s.top_k < n else n
        if keep_k < n:
            kth = np.partition(x, n - keep_k)[n - keep_k]  # the top_k-th largest logit
            ids = np.flatnonzero(x >= kth)  # ascending; ties at kth may give a few more than top_k
        else:
            ids = np.arange(n)
        order = np.argsort(-x[ids], kind="stable")[:keep_k]  # stable: lowest id first on ties
        ids = ids[order]
        vals = x[ids]
        p = np.exp(vals - vals[0])
        p /= p.sum()
        keep = np.ones(ids.shape[0], dtype=bool)
        if s.top_p < 1.0:
            keep &= (np.cumsum(p) - p) < s.top_p
        if s.min_p > 0.0:
            keep &= p >= s.min_p * p[0]
        keep[0] = True
        ids, vals = ids[keep], vals[keep]
        p = np.exp((vals - vals[0]) / s.temperature)
        return ids, p / p.sum()

    def draw(self, ids: np.ndarray, probs: np.ndarray) -> int:
        cdf = np.cumsum(probs)
        return int(ids[min(int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right")), ids.shape[0] - 1)])

    def sample(self, row: np.ndarray, history: Sequence[int]) -> int:
        """One token from the chain; the same token as ``draw(*distribution(...))`` with the
        same RNG state, done in one native call when the library is available."""
        x = self.penalise(row, history)
        s = self.settings
        if s.temperature > 0 and native.accepts_row(x):
            return native.sample(x, s.temperature, s.top_k, s.top_p, s.min_p, self.rng.random())
        return self.draw(*self._chain_numpy(x))

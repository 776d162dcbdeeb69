"""Sampling the target: llama.cpp's chain, and draws that depend only on where they are.

Chain order follows llama.cpp's default sampler: penalties -> top-k -> top-p -> min-p ->
temperature -> draw. Temperature 0 is greedy (argmax after penalties).

A draw depends only on (seed, position in the text, stream): the same position with the same
history gives the same token whatever else happened before it. So a seed reproduces a
generation whatever the draft lengths were (the cost-aware controller picks them from timings),
and speculative verification only has to compare a drafted token with the target's own draw at
its position (``fly_cpp.rounds.verify``).

- stream 0, the target's own draw, by default (``draw`` "shared") the Gumbel-max trick below, so
  that a draft model sampling its own row with the same chain and the same noise at the same
  position (``Sampler.sample`` on the draft's logits) drafts the target's token whenever their
  distributions are close enough: on the Qwen2.5-Coder pair's sampled chat answers at T 0.8 the
  draft's token equalled the target's at 0.707 of positions this way, 0.666 with the draft's
  argmax. With ``draw`` "llama" it is llama.cpp's draw: its last sampler walks the chain's survivors,
  most likely first, until their probability reaches u times the total, with u the next number
  of a Mersenne Twister seeded with the request's seed, one number per generated token. Here the
  n-th generated token takes the n-th number (``LlamaUniforms``), so a seed writes the text
  llama-server writes with that seed, target-only or speculative (the draft then drafts its
  argmax: coupled to the same uniform it matched at only 0.642).
- other streams (FLy's second draw), and stream 0 under a shared draw: the Gumbel-max trick with noise that is a function of
  (seed, position, stream, token id) alone: argmax over the kept ids of log p + G.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import numpy as np

from fly_cpp.backend import native
from fly_cpp.backend.rows import argmax
from fly_cpp.config import SamplingSettings

_MIX1, _MIX2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        return x ^ (x >> np.uint64(31))


def uniforms(seed: int, position: int, stream: int, ids: np.ndarray) -> np.ndarray:
    """(n,) float64 in (0, 1): the noise of ``ids`` at ``position`` of ``stream`` under ``seed``."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) * _GOLDEN
                   + np.uint64(position & 0xFFFFFFFF) * _MIX2 + np.uint64(stream & 0xFFFF) * _MIX1)
        bits = _mix(key + np.asarray(ids, dtype=np.uint64) * _GOLDEN)
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


class LlamaUniforms:
    """The numbers in [0, 1) llama.cpp's sampler draws from ``std::mt19937(seed)``: a double built
    from two 32-bit outputs, low word first (``std::generate_canonical<double, 53>``)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._bits: np.random.MT19937 | None = None  # made at the first draw (greedy runs never draw)
        self._made: list[float] = []

    def __getitem__(self, n: int) -> float:
        if self._bits is None:
            legacy = np.random.RandomState(self.seed & 0xFFFFFFFF).get_state()  # the C++ engine's seeding
            self._bits = np.random.MT19937()
            self._bits.state = {"bit_generator": "MT19937", "state": {"key": legacy[1], "pos": legacy[2]}}
        while len(self._made) <= n:
            lo, hi = (int(x) for x in self._bits.random_raw(2))
            self._made.append(min((lo + hi * 2.0**32) / 2.0**64, 1.0 - 2.0**-53))
        return self._made[n]


class LogitBias:
    """Additive changes to the logits of a few tokens, llama.cpp's first sampler: ``logit_bias``
    (-inf bans a token) and ``ignore_eos`` (bans the end-of-generation tokens). The target's
    sampler and the draft model's greedy choice both see them; the logits themselves (what the
    entropy gate and ``n_probs`` read) stay raw."""

    def __init__(self, pairs: Iterable[tuple[int, float]], banned: Iterable[int] = ()) -> None:
        merged: dict[int, float] = {}
        for token, bias in pairs:
            merged[int(token)] = merged.get(int(token), 0.0) + float(bias)
        for token in banned:
            merged[int(token)] = -np.inf
        self.ids = np.fromiter(merged, dtype=np.int64, count=len(merged))
        self.values = np.fromiter(merged.values(), dtype=np.float32, count=len(merged))
        self.banned = frozenset(t for t, v in merged.items() if v == -np.inf)

    def __bool__(self) -> bool:
        return bool(self.ids.size)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """(..., V) logits -> a biased float32 copy (ids beyond V are skipped)."""
        out = np.array(logits, dtype=np.float32, copy=True)
        keep = self.ids < out.shape[-1]
        out[..., self.ids[keep]] += self.values[keep]
        return out

    def cut(self, tokens: list[int]) -> list[int]:
        """A draft up to its first banned token."""
        for i, t in enumerate(tokens):
            if t in self.banned:
                return tokens[:i]
        return tokens


NO_BIAS = LogitBias(())


def draft_sampler(settings: SamplingSettings, seed: int, bias: LogitBias = NO_BIAS, start: int = 0) -> Sampler | None:
    """The sampler a draft drafts with for a generation of ``settings`` and ``seed``: the
    target's own (its chain, the seed's noise at each position) where the generation shares
    draws (``SamplingSettings.shares_draws``), so that the draft's tokens are the target's
    draws wherever the two distributions agree enough, at ``draft_temp_scale`` times the
    temperature (a draft flatter than its target meets the target's draws more often drawn
    cooler); None: the draft's argmax (greedy, llama.cpp's draw, or a scale of 0)."""
    temperature = settings.temperature * settings.draft_temp_scale
    if not settings.shares_draws or temperature == 0:
        return None
    drafting = settings if temperature == settings.temperature else replace(settings, temperature=temperature)
    return Sampler(drafting, seed, bias, start)


class Sampler:
    """Target-side token choice for one generation (its seed fixes every draw)."""

    def __init__(self, settings: SamplingSettings, seed: int, bias: LogitBias = NO_BIAS, start: int = 0) -> None:
        """``start``: the position of the first generated token (the prompt's length)."""
        self.settings = settings
        self.seed = seed
        self.bias = bias
        self.start = start
        self.uniforms = LlamaUniforms(seed)
        self.adjusts = settings.penalised or bool(bias)  # whether rows are changed before the chain

    def penalise(self, row: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """(V,) logits -> (V,) adjusted copy: the logit bias, then llama.cpp's
        repeat/presence/frequency rules."""
        s = self.settings
        if self.bias:
            row = self.bias.apply(row)
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
        if not self.adjusts:
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

    def draw(self, ids: np.ndarray, probs: np.ndarray, position: int, stream: int = 0) -> int:
        """The token of (position, stream) from the distribution (ids, probs)."""
        if ids.shape[0] == 1:
            return int(ids[0])
        if stream == 0 and self.settings.draw == "llama":  # probs are in order of logit, as llama.cpp walks them
            u = self.uniforms[max(position - self.start, 0)]
            return int(ids[min(int(np.searchsorted(np.cumsum(probs), u, side="left")), ids.shape[0] - 1)])
        return int(ids[int(np.argmax(self._scores(ids, probs, position, stream)))])

    def _scores(self, ids: np.ndarray, probs: np.ndarray, position: int, stream: int = 0) -> np.ndarray:
        """The Gumbel-max scores of (position, stream): log p + G, G the noise of each id there."""
        gumbel = -np.log(-np.log(uniforms(self.seed, position, stream, ids)))
        with np.errstate(divide="ignore"):
            return np.log(probs) + gumbel

    def drafts(self, rows: np.ndarray, history: Sequence[int], guess: Sequence[int] = ()) -> np.ndarray:
        """(n, V) a draft's logits after ``history`` and each prefix of ``guess`` -> (n,) its token
        per row, drawn as this sampler draws the target's there: the same chain (bias and
        penalties included) on the draft's row, the same noise at the row's position."""
        return np.array([self.sample(rows[i], [*history, *guess[:i]]) for i in range(rows.shape[0])], dtype=np.int64)

    def ranked(self, row: np.ndarray, history: Sequence[int]) -> tuple[int, int, float]:
        """``sample``'s token after ``history``, the runner-up (-1 where the chain keeps one token)
        and how far apart their scores lie in nats: log p + G under the shared draw (where the
        runner-up is the token the same noise would give a slightly different row), the logits
        under llama.cpp's draw. A tree's branch drafts the runner-up (``fly_cpp.drafters.tree``)."""
        ids, probs = self.distribution(row, history)
        if ids.shape[0] == 1:
            return int(ids[0]), -1, float("inf")
        if self.settings.draw == "llama":
            score = np.log(probs)
            first = self.draw(ids, probs, len(history))
        else:
            score = self._scores(ids, probs, len(history))
            first = int(ids[int(np.argmax(score))])
        at = int(np.flatnonzero(ids == first)[0])
        top = score[at]
        score[at] = -np.inf
        second = int(np.argmax(score))
        return first, int(ids[second]), abs(float(top - score[second]))  # llama.cpp's draw may take the less likely

    def sample(self, row: np.ndarray, history: Sequence[int], stream: int = 0) -> int:
        """The target's token after ``history`` (its position is ``len(history)``): the chain,
        then the position's draw. ``stream`` tells independent draws at one position apart."""
        return self.draw(*self.distribution(row, history), len(history), stream)

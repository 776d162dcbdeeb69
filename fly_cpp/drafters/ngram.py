"""N-gram prompt lookup: guess the continuation of the context from the context itself.

``lookup`` / ``match`` scan the whole context (a few hundred microseconds at 2000 tokens);
``Index`` answers the same question from a table it keeps up to date as the context grows, in
microseconds, so that every round can look (what the pacer learns guesses from).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from fly_cpp.backend.cache import common_prefix


def lookup(tokens: Sequence[int] | np.ndarray, max_n: int = 4, n_pred: int = 6, earliest: bool = True) -> list[int]:
    """Find an earlier occurrence of the context's last n tokens (n from ``max_n`` down to 1)
    and return up to ``n_pred`` tokens that followed it; [] when nothing matches.

    ``earliest`` picks the first occurrence in the context (the authors' choice); otherwise
    the most recent one.
    """
    return match(tokens, max_n, n_pred, earliest)[1]


def match(tokens: Sequence[int] | np.ndarray, max_n: int = 4, n_pred: int = 6, earliest: bool = True) -> tuple[int, list[int]]:
    """``lookup``, with the length of the n-gram the guess continues: (n, guess), (0, []) when
    nothing matches. A longer match makes a surer guess (``fly_cpp.kauto.evidence`` weighs them apart)."""
    arr = np.asarray(tokens, dtype=np.int64)
    size = arr.shape[0]
    for n in range(min(max_n, size - 1), 0, -1):
        # windows[j] = arr[j:j+n] for j <= size-1-n, so a token always follows the occurrence
        windows = sliding_window_view(arr[: size - 1], n)
        hits = np.flatnonzero((windows == arr[size - n:]).all(axis=1))
        if hits.size:
            start = int(hits[0] if earliest else hits[-1]) + n
            return n, arr[start : start + n_pred].tolist()
    return 0, []


class Index:
    """``match`` (earliest occurrence) over a context that grows and is cut back between calls,
    as a generation's is: the earliest position after each n-gram (n <= ``max_n``) that a token
    follows, updated by the tokens added or removed since the last call."""

    def __init__(self, max_n: int = 4) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}  # n-gram -> where the token after its earliest occurrence is
        self.added: list[list[tuple[int, ...]]] = []  # the n-grams first seen when token i was added

    def match(self, tokens: Sequence[int], n_pred: int = 6) -> tuple[int, list[int]]:
        """As ``match(tokens, max_n, n_pred)``."""
        self._sync(tokens)
        size = len(tokens)
        for n in range(min(self.max_n, size - 1), 0, -1):
            start = self.after.get(tuple(tokens[size - n:]))
            if start is not None:
                return n, list(tokens[start : start + n_pred])
        return 0, []

    def _sync(self, tokens: Sequence[int]) -> None:
        keep = common_prefix(self.tokens, tokens)
        while len(self.tokens) > keep:
            for key in self.added.pop():
                del self.after[key]
            self.tokens.pop()
        for i in range(keep, len(tokens)):
            self.tokens.append(int(tokens[i]))
            fresh = []
            for n in range(1, min(self.max_n, i) + 1):  # the n-grams that token i follows
                key = tuple(self.tokens[i - n : i])
                if key not in self.after:
                    self.after[key] = i
                    fresh.append(key)
            self.added.append(fresh)

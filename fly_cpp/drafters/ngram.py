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

    def walk(self, tokens: Sequence[int], start: int) -> list[tuple[int, bool]]:
        """Brought to ``tokens[:start]``, then to all of them: for each position i >= start whose
        context ``tokens[:i]`` a guess continues, (the match's length, whether the guess starts
        with ``tokens[i]``), found as the token is added (no lookup of its own)."""
        self._sync(tokens[:start])
        return self._extend(tokens[start:])

    def _sync(self, tokens: Sequence[int]) -> None:
        keep = common_prefix(self.tokens, tokens)
        while len(self.tokens) > keep:
            for key in self.added.pop():
                del self.after[key]
            self.tokens.pop()
        self._extend(tokens[keep:])

    def _extend(self, new: Sequence[int]) -> list[tuple[int, bool]]:
        """Add ``new``, token by token: the n-grams each follows are indexed where first seen,
        and the longest of them seen before (the match ``match`` finds there) says whether the
        token after it was this one; those (length, right) pairs, as ``walk`` returns them."""
        tokens, added, setdefault, max_n = self.tokens, self.added, self.after.setdefault, self.max_n
        tail, found = tuple(tokens[len(tokens) - min(max_n, len(tokens)):]), []
        for token in new:
            token, i, key, fresh, longest = int(token), len(tokens), tail, [], True
            while key:  # the longest n-gram first
                at = setdefault(key, i)
                if at == i:
                    fresh.append(key)
                elif longest:
                    found.append((len(key), tokens[at] == token))
                    longest = False
                key = key[1:]
            tokens.append(token)
            added.append(fresh)
            tail = (tail + (token,))[-max_n:]
        return found

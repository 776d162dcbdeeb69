"""N-gram prompt lookup: guess the continuation of the context from the context itself."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def lookup(tokens: Sequence[int] | np.ndarray, max_n: int = 4, n_pred: int = 6, earliest: bool = True) -> list[int]:
    """Find an earlier occurrence of the context's last n tokens (n from ``max_n`` down to 1)
    and return up to ``n_pred`` tokens that followed it; [] when nothing matches.

    ``earliest`` picks the first occurrence in the context (the authors' choice); otherwise
    the most recent one.
    """
    arr = np.asarray(tokens, dtype=np.int64)
    size = arr.shape[0]
    for n in range(min(max_n, size - 1), 0, -1):
        # windows[j] = arr[j:j+n] for j <= size-1-n, so a token always follows the occurrence
        windows = sliding_window_view(arr[: size - 1], n)
        hits = np.flatnonzero((windows == arr[size - n:]).all(axis=1))
        if hits.size:
            start = int(hits[0] if earliest else hits[-1]) + n
            return arr[start : start + n_pred].tolist()
    return []

"""Fidelity: how far a mode's output is from what the target alone writes.

- ``agreement``: the share of positions where the two token sequences hold the same token
  (over the longer of the two, so a shorter or longer output counts its extra positions as
  disagreements), and the first position where they differ (None when identical).
- the target's mean negative log-likelihood (nats per token) of an output, teacher-forced
  after the prompt, comes from ``Engine.score`` (``fly_cpp.rounds.scoring``). It says how much worse
  the target finds a text; the target's own greedy output is the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def agreement(tokens: Sequence[int], reference: Sequence[int]) -> tuple[float, int | None]:
    n = max(len(tokens), len(reference))
    if n == 0:
        return 1.0, None
    a = np.asarray(tokens[: len(reference)], dtype=np.int64)
    b = np.asarray(reference[: len(tokens)], dtype=np.int64)
    same = a == b  # (min(len),)
    first = int(np.argmin(same)) if not same.all() else (None if len(tokens) == len(reference) else len(same))
    return float(same.sum()) / n, first

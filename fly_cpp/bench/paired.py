"""Paired comparison of task correctness: a mode against the reference, problem by problem.

Every mode runs the same problems, so the fair question is not "which accuracy is higher" but
"on how many problems did the mode pass where the target failed (won), and fail where the
target passed (lost)". Problems both pass or both fail say nothing about the difference. Under
the null hypothesis that the mode is as good as the target, each of the won + lost problems is
a fair coin; the two-sided exact sign test gives the probability of a split at least as uneven
as the one seen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def sign_test(won: int, lost: int) -> float:
    """Two-sided exact sign test: P(a split at least as uneven as won:lost | p = 1/2)."""
    n = won + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(won, lost) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def won_lost(passed: Mapping[str, bool], reference: Mapping[str, bool]) -> tuple[int, int, int]:
    """(won, lost, paired problems) over the problems both mappings checked."""
    common = [p for p in passed if p in reference]
    won = sum(1 for p in common if passed[p] and not reference[p])
    lost = sum(1 for p in common if reference[p] and not passed[p])
    return won, lost, len(common)

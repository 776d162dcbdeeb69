"""Steady verification batches: every round's target decode padded to one width.

On a GPU a decode of the same shape as the one before is much cheaper than one of another
shape: llama.cpp reuses its graph only for a batch of the same size, and the CUDA backend
replays a captured graph only for the shape it captured (anything else runs kernel by kernel).
Measured on an H100 (docs/benchmarks-log.md): k auto's rounds, whose batches change size from round to round,
took 3.4-3.6 ms of target decode where a fixed k of about as many rows took 2.5-2.6 ms.

``Steady`` pads each round's batch to the widest of the last ``SPAN`` rounds (the padded rows
repeat the last token and are dropped again: the loop rolls the cache back past them), so the
shape changes only when a round needs more rows than any recent one, or when the widest leaves
the span. A CPU pays for every padded row, so "auto" pads only where the target runs on a
device; the default is off until a GPU run has measured it against ragged batches (bench modes
``fly-steady`` and ``fly-ragged``).
"""

from __future__ import annotations

from collections import deque

SPAN = 16  # rounds whose widest batch sets the width


class Steady:
    """The width of one generation's verification batches."""

    def __init__(self, span: int = SPAN) -> None:
        self.recent: deque[int] = deque(maxlen=span)

    def width(self, rows: int, room: int) -> int:
        """Rows to decode for a round that needs ``rows``, at most ``room`` (what the cache holds
        still), never fewer than ``rows``."""
        self.recent.append(rows)
        return max(rows, min(max(self.recent), room))


def padded(tokens: list[int], width: int) -> list[int]:
    """``tokens`` repeated at its last token up to ``width`` rows."""
    return tokens + [tokens[-1]] * (width - len(tokens))

"""A JSON schema's integer bounds (``minimum``, ``maximum``, ``exclusiveMinimum``,
``exclusiveMaximum``) as a GBNF expression for the integers in the range, written as JSON writes
them (no leading zeros, ``-`` for negatives).

llama-cpp-python's JSON-schema converter ignores these keywords, so without this a schema's
``{"type": "integer", "minimum": 1, "maximum": 5}`` would let the answer write 7. The range is
spelled digit by digit: the numbers of each length, and within one length a common prefix, then
a middle run of whole digit classes, then the two edges, each again a range one digit shorter.
"""

from __future__ import annotations

import math
from typing import Any

from fly_cpp.basics.errors import FlyError

KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def bounds(schema: dict[str, Any]) -> tuple[int | None, int | None]:
    """The inclusive integer range ``schema``'s keywords allow (None: unbounded on that side)."""
    lo = hi = None
    for key in KEYWORDS:
        value = schema.get(key)
        if isinstance(value, bool) or value is None:
            continue  # draft 4's boolean exclusive* modifies minimum/maximum: read below
        if not isinstance(value, (int, float)):
            raise FlyError(f"invalid JSON schema: {key} must be a number, got {value!r}")
        if key == "minimum":
            edge = math.ceil(value) + (1 if schema.get("exclusiveMinimum") is True and value == math.ceil(value) else 0)
            lo = edge if lo is None else max(lo, edge)
        elif key == "exclusiveMinimum":
            edge = math.floor(value) + 1
            lo = edge if lo is None else max(lo, edge)
        elif key == "maximum":
            edge = math.floor(value) - (1 if schema.get("exclusiveMaximum") is True and value == math.floor(value) else 0)
            hi = edge if hi is None else min(hi, edge)
        else:
            edge = math.ceil(value) - 1
            hi = edge if hi is None else min(hi, edge)
    if lo is not None and hi is not None and lo > hi:
        raise FlyError(f"invalid JSON schema: no integer lies in [{lo}, {hi}] (minimum above maximum)")
    return lo, hi


def integer_range(lo: int | None, hi: int | None) -> str:
    """GBNF for the integers in [lo, hi] (inclusive; None: unbounded)."""
    alts = []
    if hi is None or hi >= 0:
        alts += _magnitudes(max(lo, 0) if lo is not None else 0, hi)
    if lo is None or lo < 0:
        least = 1 if hi is None or hi >= 0 else -hi
        alts.append('"-" ' + _group(_magnitudes(least, None if lo is None else -lo)))
    return _group(alts)


def _magnitudes(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the non-negative integers in [lo, hi] (hi None: no upper bound)."""
    top = len(str(lo)) if hi is None else len(str(hi))
    alts = []
    for n in range(len(str(lo)), top + 1):
        first = max(lo, 10 ** (n - 1) if n > 1 else 0)
        last = 10 ** n - 1 if hi is None else min(hi, 10 ** n - 1)
        alts += _same_length(str(first), str(last))
    if hi is None:  # and every longer number
        alts.append("[1-9]" + " [0-9]" * top + " [0-9]*")
    return alts


def _same_length(lo: str, hi: str) -> list[str]:
    """Alternatives for the digit strings of one length from ``lo`` to ``hi`` (lo <= hi)."""
    if lo == hi:
        return [f'"{lo}"']
    rest = len(lo) - 1
    a, b = int(lo[0]), int(hi[0])
    if a == b:
        return [f'"{a}" ' + _group(_same_length(lo[1:], hi[1:]))]
    alts = []
    low_whole, high_whole = lo[1:] == "0" * rest, hi[1:] == "9" * rest
    if not low_whole:
        alts.append(f'"{a}" ' + _group(_same_length(lo[1:], "9" * rest)))
    start, end = a + (not low_whole), b - (not high_whole)
    if start <= end:
        alts.append((f'"{start}"' if start == end else f"[{start}-{end}]") + " [0-9]" * rest)
    if not high_whole:
        alts.append(f'"{b}" ' + _group(_same_length("0" * rest, hi[1:])))
    return alts


def _group(alts: list[str]) -> str:
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

"""Where the code blocks of an answer are: is a token inside a ``` fence?

A token is inside a code block when the answer's text before it holds an odd number of ```
fences (counted on bytes, anywhere on a line: lenient Markdown, which is what chat models write).
The fence token itself is therefore outside when it opens a block and inside when it closes
one. Only the generated answer counts, not the prompt.

``Fences`` keeps the state after every committed answer token, so a round costs the new
tokens only; the committed text may also be cut back (a refuted cross-round window).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

FENCE = b"```"


def _advance(state: tuple[bool, bytes], piece: bytes) -> tuple[bool, bytes]:
    """(inside, last bytes that may start a fence) after ``piece``."""
    inside, carry = state
    text = carry + piece
    inside ^= text.count(FENCE) % 2 == 1
    at = text.rfind(FENCE)
    rest = text[at + len(FENCE):] if at >= 0 else text
    return inside, rest[-(len(FENCE) - 1):]


class Fences:
    """Code-block state of one generation's answer (tokens after ``start`` of ``committed``)."""

    def __init__(self, piece: Callable[[int], bytes], start: int) -> None:
        self.piece, self.start = piece, start
        self.tokens: list[int] = []
        self.states: list[tuple[bool, bytes]] = [(False, b"")]  # states[j]: after j answer tokens

    def _sync(self, answer: Sequence[int]) -> None:
        n = min(len(self.tokens), len(answer))
        same = np.asarray(self.tokens[:n]) == np.asarray(answer[:n], dtype=np.int64)
        keep = n if same.all() else int(np.argmin(same))
        del self.tokens[keep:], self.states[keep + 1:]
        for t in answer[keep:]:
            self.states.append(_advance(self.states[-1], self.piece(t)))
            self.tokens.append(t)

    def rebase(self, committed: Sequence[int], drop: int) -> None:
        """As ``Constraint.rebase``: the state after all of ``committed`` stays through a
        context shift that takes ``drop`` tokens out of it."""
        self._sync(list(committed[self.start:]))
        self.tokens, self.states, self.start = [], self.states[-1:], len(committed) - drop

    def inside(self, committed: Sequence[int], drafted: Sequence[int]) -> np.ndarray:
        """(m,) bool: does drafted token i start inside a code block (after committed + d_1..d_{i-1})?"""
        self._sync(list(committed[self.start:]))
        state = self.states[-1]
        out = np.zeros(len(drafted), dtype=bool)
        for i, t in enumerate(drafted):
            out[i] = state[0]
            state = _advance(state, self.piece(t))
        return out

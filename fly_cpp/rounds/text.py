"""From tokens to released text: incremental UTF-8 decoding and stop strings.

Text that might be the beginning of a stop string is held back (with the steps that carry
it) until the next tokens settle the question, so nothing a user was shown is ever taken back.
"""

from __future__ import annotations

import codecs
import dataclasses
from collections.abc import Callable, Sequence

from fly_cpp.rounds.step import Step


class StopFilter:
    """Feed steps in, get the steps that are safe to show out (with their final text)."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.stop = tuple(s for s in stop if s)
        self.pending: list[Step] = []
        self.stopped = False
        self.word = ""  # the stop string that ended the text

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def push(self, step: Step) -> list[Step]:
        self.pending.append(step)
        text = "".join(s.text for s in self.pending)
        hits = [(i, s) for i, s in ((text.find(s), s) for s in self.stop) if i >= 0]
        if hits:
            at, self.word = min(hits, key=lambda hit: hit[0])  # the earliest; the first listed on ties
            self.stopped = True
            return self._release(at, truncate=True)
        return self._release(len(text) - self._held_back(text), truncate=False)

    def flush(self) -> list[Step]:
        out, self.pending = self.pending, []
        return out

    def _release(self, upto: int, truncate: bool) -> list[Step]:
        """Release steps whose text ends at or before ``upto``; with ``truncate`` the step that
        straddles ``upto`` is cut there and everything after it is dropped."""
        out: list[Step] = []
        pos = 0
        for i, s in enumerate(self.pending):
            end = pos + len(s.text)
            if end <= upto:
                out.append(s)
            else:
                if truncate and pos < upto:
                    out.append(dataclasses.replace(s, text=s.text[: upto - pos]))
                self.pending = [] if truncate else self.pending[i:]
                return out
            pos = end
        self.pending = []
        return out


class Detokenizer:
    """Token -> newly complete text, holding back bytes of an unfinished UTF-8 character."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self.piece = piece
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int) -> str:
        return self.decoder.decode(self.piece(token))

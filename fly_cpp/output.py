"""Committed tokens on their way to the user.

A token is released at once, or held while it sits in a provisional segment (cross-round
window) until that segment is confirmed or refuted, so nothing a user was shown is ever taken
back. Text, stop strings and max tokens are decided on release, in order.
"""

from __future__ import annotations

from collections.abc import Callable

from fly_cpp.step import Stats, Step
from fly_cpp.text import Detokenizer, StopFilter


class Output:
    def __init__(self, piece: Callable[[int], bytes], stop: tuple[str, ...], max_tokens: int, stats: Stats) -> None:
        self.detok = Detokenizer(piece)
        self.stops = StopFilter(stop)
        self.max_tokens = max_tokens
        self.stats = stats
        self.held: list[tuple[int, bool, bool, int]] = []
        self.ready: list[Step] = []
        self.finish_reason: str | None = None if max_tokens > 0 else "length"

    def add(self, token: int, drafted: bool, loose: bool, round: int, hold: bool = False) -> None:
        if hold:
            self.held.append((token, drafted, loose, round))
        else:
            self._release(token, drafted, loose, round)

    def confirm(self) -> None:
        held, self.held = self.held, []
        for token, drafted, loose, round in held:
            self._release(token, drafted, loose, round)

    def refute(self) -> None:
        self.held.clear()

    def finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def take(self) -> list[Step]:
        out, self.ready = self.ready, []
        if self.finish_reason is not None:
            out += self.stops.flush()
        return out

    def _release(self, token: int, drafted: bool, loose: bool, round: int) -> None:
        if self.finish_reason is not None:
            return
        self.stats.n_tokens += 1
        self.ready += self.stops.push(Step(token, self.detok(token), drafted, loose, round))
        if self.stops.stopped:
            self.finish("stop")
        elif self.stats.n_tokens >= self.max_tokens:
            self.finish("length")

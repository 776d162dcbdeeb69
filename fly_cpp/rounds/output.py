"""Committed tokens on their way to the user.

A token is released at once, or held while it sits in a provisional segment (cross-round
window) until that segment is confirmed or refuted, so nothing a user was shown is ever taken
back. Text, stop strings and max tokens are decided on release, in order, and the way the text
ended is recorded at that moment (``Finish``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fly_cpp.rounds.request import Request
from fly_cpp.rounds.step import Stats, Step, TokenProbs
from fly_cpp.rounds.text import Detokenizer, StopFilter


@dataclass(frozen=True)
class Finish:
    """How a generation ended. reason: OpenAI's "stop" or "length". kind: llama-server's
    stop_type, "eos" (an end-of-generation token), "word" (a stop string, ``word``) or "limit"
    (max tokens, or the context is full: ``context_full``; or the generation was stopped from
    outside, ``interrupted``: the server is shutting down)."""

    reason: str
    kind: str
    word: str = ""
    context_full: bool = False
    interrupted: bool = False


class Output:
    def __init__(self, request: Request, piece: Callable[[int], bytes], is_eog: Callable[[int], bool]) -> None:
        self.detok = Detokenizer(piece)
        self.stops = StopFilter(request.stop)
        self.is_eog = is_eog
        self.max_tokens = request.max_tokens
        self.stats = Stats(mode=request.rules.mode, n_prompt=len(request.prompt))
        self.held: list[tuple[int, bool, bool, int, TokenProbs | None]] = []
        self.ready: list[Step] = []
        self.finish: Finish | None = None if request.max_tokens > 0 else Finish("length", "limit")

    def add(self, token: int, drafted: bool, loose: bool, round: int, hold: bool = False,
            probs: TokenProbs | None = None) -> None:
        if hold:
            self.held.append((token, drafted, loose, round, probs))
        else:
            self._release(token, drafted, loose, round, probs)

    def confirm(self) -> None:
        held, self.held = self.held, []
        for token, drafted, loose, round, probs in held:
            self._release(token, drafted, loose, round, probs)

    def refute(self) -> None:
        self.held.clear()

    def end(self, reason: str, kind: str, word: str = "", context_full: bool = False) -> None:
        if self.finish is None:
            self.finish = Finish(reason, kind, word, context_full)

    def interrupt(self) -> None:
        """End the text now, from any thread (the loop stops after its current round; held
        tokens are dropped): it reads as cut at a limit, marked ``interrupted``."""
        if self.finish is None:
            self.finish = Finish("length", "limit", interrupted=True)

    def take(self) -> list[Step]:
        out, self.ready = self.ready, []
        if self.finish is not None:
            out += self.stops.flush()
        return out

    def _release(self, token: int, drafted: bool, loose: bool, round: int, probs: TokenProbs | None = None) -> None:
        if self.finish is not None:
            return
        if self.is_eog(token):
            self.stats.n_eog = 1
            self.end("stop", "eos")
            return
        self.stats.n_tokens += 1
        self.ready += self.stops.push(Step(token, self.detok(token), drafted, loose, round, probs))
        if self.stops.stopped:
            self.end("stop", "word", self.stops.word)
        elif self.stats.n_tokens >= self.max_tokens:
            self.end("length", "limit")

"""A grammar along one generation: the state at every generated position.

The verifier asks for the grammar's state at each row it verifies, which is the state after the
committed text and the drafted tokens before that row. ``Constraint`` keeps one state per
committed position (a fork costs a few microseconds), so a rollback of any length, a refuted
cross-round window included, is a cut of that list: ``sync`` follows ``committed`` by common
prefix and feeds only what is new. A drafted token the grammar forbids ends the draft's usable
part (``usable``); every row is masked with its own state (``mask``), so every emitted token,
exact, loosely accepted, correction or bonus, greedy or sampled, is one the grammar allows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from fly_cpp.backend.cache import common_prefix
from fly_cpp.backend.grammar import Grammar
from fly_cpp.basics.errors import FlyError


class Rules(Protocol):
    """One state of a grammar (``backend.grammar.Grammar``, or ``Lazy`` around one)."""

    def mask(self, row: np.ndarray) -> None: ...
    def allows(self, token: int) -> bool: ...
    def accept(self, token: int) -> None: ...
    def copy(self) -> Rules: ...
    def close(self) -> None: ...


class Lazy:
    """A lazy grammar: the text is free until it writes ``trigger``; what follows the word obeys
    ``grammar``. The word may straddle tokens, and the token that completes it may carry text
    after it: that text is fed to the grammar (tokenized), and if the grammar refuses it the
    word does not start the grammar (the text stays free). llama.cpp's own lazy grammar replays
    such a token and aborts the process on text it refuses; this one never feeds it a refused token."""

    def __init__(self, grammar: Grammar, trigger: str | bytes, tokenize: Callable[..., list[int]], *,
                 piece: Callable[[int], bytes] | None = None, _tail: bytes = b"", _on: bool = False) -> None:
        self.grammar, self.tokenize = grammar, tokenize
        self.piece = piece or grammar.model.piece  # what a token writes (preserved special tokens included)
        self.trigger = trigger.encode() if isinstance(trigger, str) else trigger
        self.tail, self.on = _tail, _on  # tail: the last bytes written while waiting

    def mask(self, row: np.ndarray) -> None:
        if self.on:
            self.grammar.mask(row)

    def allows(self, token: int) -> bool:
        return self.grammar.allows(token) if self.on else 0 <= token < self.grammar.model.n_vocab

    def accept(self, token: int) -> None:
        """Advance past ``token`` (once the grammar has started, one it allows, as ``Grammar.accept``)."""
        if self.on:
            self.grammar.accept(token)
            return
        text = self.tail + self.piece(token)
        at = text.find(self.trigger)
        keep = len(self.trigger) - 1
        if at < 0:
            self.tail = text[-keep:]
            return
        rest = text[at + len(self.trigger):]
        probe = self.grammar.copy()
        tokens = self.tokenize(rest.decode("utf-8", "replace"), add_special=False) if rest else []
        piece = self.piece
        # the tokens must spell exactly the rest (a tokenizer may add a space in front)
        if b"".join(piece(t) for t in tokens) == rest and all(_fed(probe, t) for t in tokens):
            self.grammar.close()
            self.grammar, self.on = probe, True
        else:
            probe.close()
            self.tail = rest[-keep:]

    def copy(self) -> Lazy:
        return Lazy(self.grammar.copy(), self.trigger, self.tokenize, piece=self.piece, _tail=self.tail, _on=self.on)

    def close(self) -> None:
        self.grammar.close()


def _fed(state: Grammar, token: int) -> bool:
    """Feed ``token`` if the grammar allows it; whether it did."""
    if not state.allows(token):
        return False
    state.accept(token)
    return True


class Constraint:
    """``grammar``: its state before the first generated token; ``start``: the prompt's length;
    ``banned``: tokens the sampler never picks (``ignore_eos``, -inf logit_bias)."""

    def __init__(self, grammar: Rules, start: int, banned: frozenset[int] = frozenset()) -> None:
        self.start, self.banned = start, banned
        self.states: list[Rules] = [grammar]  # states[i]: after the first i generated tokens
        self.tokens: list[int] = []  # the generated tokens the states follow

    def sync(self, committed: Sequence[int]) -> None:
        """Follow ``committed`` (prompt + generated tokens): cut back to the common prefix, feed the rest."""
        text = list(committed[self.start:])
        n = common_prefix(self.tokens, text)
        for state in self.states[n + 1:]:
            state.close()
        del self.states[n + 1:], self.tokens[n:]
        for token in text[n:]:
            self.states.append(_after(self.states[-1], token))
            self.tokens.append(token)

    def rebase(self, committed: Sequence[int], drop: int) -> None:
        """A context shift takes ``drop`` tokens out of ``committed`` (``fly_cpp.rounds.shift``): the
        state after all of it stays, and the text after the shift is followed from there (no
        rollback reaches back past a shift)."""
        self.sync(committed)
        for state in self.states[1:-1]:  # states[0] is the caller's
            state.close()
        self.states, self.tokens, self.start = self.states[-1:], [], len(committed) - drop

    def ahead(self, committed: Sequence[int], drafted: Sequence[int]) -> list[Rules]:
        """The states after ``committed`` and each allowed prefix of ``drafted``: [s_0, .., s_j]
        where d_1..d_j are allowed and d_{j+1} (if any) is not."""
        self.sync(committed)
        states = [self.states[-1]]
        for token in drafted:
            if not states[-1].allows(token):
                break
            states.append(_after(states[-1], token))
        return states

    def usable(self, committed: Sequence[int], drafted: list[int]) -> list[int]:
        """``drafted`` up to its first token the grammar forbids."""
        return drafted[: len(self.ahead(committed, drafted)) - 1]

    def mask(self, logits: np.ndarray, committed: Sequence[int], drafted: Sequence[int]) -> None:
        """Mask row i of ``logits`` ((m+1, V), in place) with the state after committed + d_1..d_i."""
        states = self.ahead(committed, drafted)
        assert len(states) >= logits.shape[0], "rows past a forbidden drafted token"
        for i in range(logits.shape[0]):
            states[i].mask(logits[i])
            if not any(int(t) not in self.banned for t in np.flatnonzero(np.isfinite(logits[i]))[: len(self.banned) + 1]):
                raise FlyError("the grammar allows no token here but banned ones (ignore_eos or a -inf logit_bias "
                               "at the grammar's end?)")


def _after(state: Rules, token: int) -> Rules:
    if not state.allows(token):  # llama.cpp aborts on a forbidden token: refuse it here
        raise FlyError(f"the grammar forbids token {token} here (nothing it allows could be chosen)")
    nxt = state.copy()
    nxt.accept(token)
    return nxt

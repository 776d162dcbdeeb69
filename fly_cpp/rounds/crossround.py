"""The cross-round deferred window's state across the rounds of one generation.

A gated mismatch near the end of a draft may be kept provisionally (``hold``): the tokens from
it on are held back from the user, and later rounds' drafted tokens must complete its window
(``left`` exact matches still needed) to ``confirm`` it. A mismatch first ``refute``s it: both
caches go back to the mismatch's position and the target's own token goes there, which is
exactly what the in-round rule would have written. The rule itself is ``accept.judge``; this
module only remembers what earlier rounds decided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fly_cpp.rounds.accept import Verdict
from fly_cpp.rounds.rules import RoundRules
from fly_cpp.rounds.step import TokenProbs


@dataclass
class Pending:
    """A mismatch kept provisionally: its committed position, the target's own token there,
    the exact matches its window still needs, and the round that kept it (and, with
    ``n_probs``, the target's probabilities for its own token)."""

    pos: int
    correction: int
    left: int
    round: int
    probs: TokenProbs | None = None


class Window:
    """Off (``enabled`` False) it never holds anything, and the loop runs the in-round rule."""

    def __init__(self, rules: RoundRules) -> None:
        self.enabled = rules.cross_round
        # under the plan-independent rule every window is finished: whether it opens must not
        # hang on how the rounds went so far
        self.confidence = rules.cross_round_confidence
        self.pending: Pending | None = None
        self.hits = self.misses = 0  # drafted tokens matched / rounds ended by a mismatch

    @property
    def left(self) -> int:
        """Exact matches the open window still needs (0 when none is open)."""
        return self.pending.left if self.pending is not None else 0

    def max_left(self) -> int | None:
        """The longest unfinished window worth keeping provisionally: with the draft's running
        agreement p a window needing n more exact matches completes with probability about p**n."""
        if not self.enabled:
            return None
        p = (self.hits + 1) / (self.hits + self.misses + 2)
        return None if self.confidence <= 0 else int(math.log(self.confidence) / math.log(p))

    def holds(self, pos: int) -> bool:
        """Whether the token at committed position ``pos`` waits for a verdict."""
        return self.pending is not None and pos >= self.pending.pos

    def is_pending(self, pos: int) -> bool:
        return self.pending is not None and pos == self.pending.pos

    def observe(self, verdict: Verdict, n_drafted: int, base: int, chosen: list[int] | None, round: int) -> bool:
        """Take a round's verdict (``base``: committed length before it). Returns True when it
        confirmed the open window; opens a new one when the verdict keeps a tail mismatch."""
        self.hits += verdict.n_exact
        self.misses += verdict.accepted < n_drafted
        confirmed = verdict.confirmed
        if confirmed:
            self.pending = None
        if verdict.provisional is not None:
            assert chosen is not None
            self.pending = Pending(base + verdict.provisional, int(chosen[verdict.provisional]),
                                   verdict.window_left, round)
        elif self.pending is not None:
            self.pending.left = verdict.window_left
        return confirmed

    def hold(self, pos: int, correction: int, left: int, round: int, probs: TokenProbs | None = None) -> None:
        """Keep a mismatch found outside a draft provisionally (the draft model's token where
        the target wrote ``correction``): later rounds' drafts must show ``left`` exact matches."""
        assert self.pending is None
        self.pending = Pending(pos, correction, left, round, probs)

    def correction_probs(self, probs: TokenProbs) -> None:
        """The target's probabilities for its own token at the open window's mismatch (``n_probs``),
        given should the window fail."""
        assert self.pending is not None
        self.pending.probs = probs

    def refute(self) -> Pending:
        """Close the open window as refuted; the caller rolls back to what this returns."""
        assert self.pending is not None
        pending, self.pending = self.pending, None
        return pending

"""The target's own MTP head as the drafter (Qwen3.5/3.6 and other models that keep their
multi-token-prediction, "nextn", layers).

The head reads, at position p, token p together with the target's hidden state after position
p - 1, and predicts token p + 1. Its context (``MtpContext``) is a plain KV cache for that one
layer, kept exact the way the target's is: ``exact`` positions pair each committed token with
the target's own state (which the target records as it decodes, ``Context.keep_hidden``).
A round catches the head up on what the target decoded since the last one, in one batch that
ends with the last committed token, whose row gives the first drafted token; each further
token is one more decode, paired with the head's own state from the row before (its guesses
past the first see its own states, not the target's: the next round decodes those positions
again with the target's). This is llama.cpp's ``draft-mtp`` for a single head.

``MtpHead`` is that context one decode at a time, a ``fly_cpp.drafters.steps.Stepper`` as the
draft model is, so that the pair's drafter (``fly_cpp.drafters.drafter``) drafts with the head as
with a draft model: a fixed k, or step by step while one more is worth its measured cost. n-gram
lookup chains in front of it there: where the text so far repeats an earlier stretch, the
continuation found there is the draft (the head cannot check a guess in one pass: each of its
rows needs the state the row before produced).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fly_cpp.backend import rows
from fly_cpp.backend.cache import common_prefix
from fly_cpp.backend.mtp import MtpContext
from fly_cpp.backend.sampling import NO_BIAS, LogitBias, Sampler
from fly_cpp.drafters.seam import DraftRules
from fly_cpp.drafters.steps import Rules, Stepped, draft_steps


class MtpHead:
    """The head's context one decode at a time (``DraftModel``'s shape): ``start`` a round
    after ``committed``, then each ``step`` drafts one token, the first one's decode catching
    the cache up on what the target decoded since the last round. It checks no n-gram guess
    (``checks_guesses``): each of its rows needs the state the row before produced."""

    checks_guesses = False
    forks = False  # its state follows the target's text: no branch of its own

    def __init__(self, ctx: MtpContext, bias: LogitBias = NO_BIAS, draws: Sampler | None = None) -> None:
        """``draws``: the target's sampler, which the head draws its tokens with (None: its argmax)."""
        self.ctx = ctx
        self.n_batch = ctx.n_batch
        self.n_vocab = ctx.model.n_vocab
        self.bias = bias
        self.draws = draws
        self.decodes = 0
        self._state: np.ndarray | None = None  # the head's state after its last row (None: catch up first)

    @property
    def end(self) -> int | None:
        """The head drafts no further than the target's context can verify."""
        return self.ctx.target.n_ctx - 1

    def is_eog(self, token: int) -> bool:
        return self.ctx.model.is_eog(token)

    def prefill(self, prompt: Sequence[int]) -> None:
        """Nothing before the rounds: the head pairs each position with the target's state there,
        so its first step catches up on the prompt the target decoded."""

    def run(self, committed: Sequence[int], limit: int, need: int, drafting: DraftRules, confident: bool,
            checks: int | None = None) -> None:
        """The head has no native run: it steps."""
        return None

    def candidate(self, committed: Sequence[int]) -> int | None:
        """The head's greedy token after ``committed`` (FLy's rule asks for it where no draft of
        the head's reached): one catch-up decode (none where the target has not decoded
        ``committed[:-1]``, which the loop's invariant rules out)."""
        out, _, _ = draft_steps(self, committed, Rules(1, 1, end=self.end))
        return out[0] if out else None

    def shift(self, keep: int, drop: int) -> None:
        """The head's cache pairs each position with the target's state there: after a shift
        it catches up by common prefix (``exact``), as after any rollback."""

    def lag(self, committed: Sequence[int]) -> int:
        """Tokens the head's cache must catch up on before drafting after ``committed``."""
        return len(committed) - 1 - min(self.ctx.exact, common_prefix(self.ctx.tokens, committed[:-1]))

    def start(self, committed: Sequence[int]) -> list[int]:
        """A round after ``committed``: its first step catches up (the tokens returned, with the
        last committed token, in one batch)."""
        self._state = None
        keep = min(self.ctx.exact, common_prefix(self.ctx.tokens, committed), len(committed) - 1)
        return list(committed[keep:-1])

    def step(self, catchup: Sequence[int], history: Sequence[int], guess: Sequence[int],
             confident: bool = False, ranked: bool = False) -> Stepped:
        """The head's greedy token after ``history``: the round's first step catches the cache
        up to it (``catchup`` is implied by ``history``), a later one decodes ``history[-1]``
        with the head's own state. ``guess`` must be empty. It tells no runner-up (``ranked``):
        a tree's branch needs the cache of a model that drafts at any position."""
        if guess:
            raise ValueError("the MTP head checks no n-gram guess")
        if self._state is None:
            logits, self._state, decoded = self._catch_up(history)
        else:
            logits, self._state = self.ctx.decode(history[-1:], self._state[None, :])
            decoded = 1
        self.decodes += 1
        row = logits[None, : self.n_vocab]
        best = self.draws.drafts(row, history) if self.draws is not None else None
        if self.bias:
            row = self.bias.apply(row)
        sure = [float(rows.top_probability(row)[0])] if confident else []
        return Stepped(rows.argmax(row) if best is None else best, 0, sure, decoded)

    def _catch_up(self, committed: Sequence[int]) -> tuple[np.ndarray, np.ndarray, int]:
        """Bring the head's cache to ``committed`` (token p with the target's state after p - 1),
        the last committed token decoded in the final batch; that row's logits and state, and
        the rows decoded. A FlyError where the target has not decoded ``committed[:-1]`` (the
        loop's invariant rules it out)."""
        ctx, target = self.ctx, self.ctx.target
        n = len(committed)
        keep = min(ctx.exact, common_prefix(ctx.tokens, committed), n - 1)
        states = target.hidden(max(keep - 1, 0), n - 1)
        if keep == 0:  # position 0 follows no state: zeros, as llama.cpp starts
            states = np.vstack([np.zeros((1, ctx.n_embd), dtype=np.float32), states])
        ctx.truncate(keep)
        tokens = list(committed[keep:])
        for lo in range(0, len(tokens), ctx.n_batch):
            logits, state = ctx.decode(tokens[lo:lo + ctx.n_batch], states[lo:lo + ctx.n_batch])
        ctx.paired(n)
        return logits, state, len(tokens)

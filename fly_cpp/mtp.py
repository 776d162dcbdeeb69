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

n-gram lookup chains in front, as before the draft model: where the text so far repeats an
earlier stretch, the continuation found there is the draft (the head cannot check a guess in
one pass: each of its rows needs the state the row before produced).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fly_cpp import ngram, rows
from fly_cpp._llama import MtpContext, common_prefix
from fly_cpp.config import SpecSettings
from fly_cpp.draft_model import cut_at_end
from fly_cpp.drafters import Draft, Report
from fly_cpp.errors import FlyError
from fly_cpp.sampling import NO_BIAS, LogitBias

DEFAULT_K = 3  # llama.cpp's --spec-draft-n-max default, what k auto drafts with the head for now


class MtpDrafter:
    """Greedy drafting with the target's MTP head, up to the round's limit; it stops after an
    end-of-generation token, or where the head's top probability falls under ``p_min`` once
    ``need`` tokens are drafted. The head's choices see the generation's logit bias."""

    def __init__(self, ctx: MtpContext, spec: SpecSettings, bias: LogitBias = NO_BIAS) -> None:
        self.ctx = ctx
        self.spec = spec
        self.bias = bias
        self.n_vocab = ctx.model.n_vocab
        self.index = ngram.Index(spec.ngram_max)
        self.steps = 0  # head decodes

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, committed: Sequence[int], limit: int, need: int = 0, confident: bool = False) -> Draft:
        if self.spec.auto:
            limit = min(limit, max(DEFAULT_K, need))
        if limit <= 0:
            return Draft()
        if self.spec.ngram and need == 0:  # an open window is completed by the head's own tokens
            guess = self.bias.cut(self.index.match(committed, min(self.spec.ngram_tokens, limit))[1])
            if guess:
                return Draft(guess, [None] * len(guess))
        return self.head(committed, limit, need, confident)

    def lag(self, committed: Sequence[int]) -> int:
        """Tokens the head's cache must catch up on before drafting after ``committed``."""
        return len(committed) - 1 - min(self.ctx.exact, common_prefix(self.ctx.tokens, committed[:-1]))

    def head(self, committed: Sequence[int], limit: int, need: int = 0, confident: bool = False) -> Draft:
        """Up to ``limit`` of the head's own tokens after ``committed`` (empty where the target has
        not decoded ``committed[:-1]``, which the loop's invariant rules out)."""
        spec, ctx = self.spec, self.ctx
        n = len(committed)
        first = self._catch_up(committed)
        if first is None:
            return Draft()
        logits, state = first
        out: list[int] = []
        confidences: list[float | None] = []
        want_confidence = confident or spec.p_min > 0
        while True:
            row = self.bias.apply(logits[None, : self.n_vocab]) if self.bias else logits[None, : self.n_vocab]
            token = int(rows.argmax(row)[0])
            sure = float(rows.top_probability(row)[0]) if want_confidence else None
            if spec.p_min > 0 and len(out) >= need and sure is not None and sure < spec.p_min:
                break
            out.append(token)
            confidences.append(sure)
            if cut_at_end(out, [token], ctx.model.is_eog) or len(out) >= limit or n + len(out) > ctx.target.n_ctx - 1:
                break
            logits, state = ctx.decode([token], state[None, :])
            self.steps += 1
        return Draft(out, confidences, by_model=True)

    def _catch_up(self, committed: Sequence[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """Bring the head's cache to ``committed`` (token p with the target's state after p - 1),
        the last committed token decoded in the final batch; that row's logits and state."""
        ctx, target = self.ctx, self.ctx.target
        n = len(committed)
        keep = min(ctx.exact, common_prefix(ctx.tokens, committed), n - 1)
        try:
            states = target.hidden(max(keep - 1, 0), n - 1)
        except FlyError:  # the target has not decoded that far (cannot happen within the loop)
            return None
        if keep == 0:  # position 0 follows no state: zeros, as llama.cpp starts
            states = np.vstack([np.zeros((1, ctx.n_embd), dtype=np.float32), states])
        ctx.truncate(keep)
        tokens = list(committed[keep:])
        for lo in range(0, len(tokens), ctx.n_batch):
            result = ctx.decode(tokens[lo:lo + ctx.n_batch], states[lo:lo + ctx.n_batch])
            self.steps += 1
        ctx.exact = n
        return result

    def candidate(self, committed: Sequence[int]) -> int | None:
        """The head's greedy token after ``committed`` (FLy's rule asks for it where no draft of
        the head's reached): one catch-up decode."""
        found = self.head(committed, 1, 1)
        return found.tokens[0] if found.tokens else None

    def accept(self, report: Report) -> None:
        pass

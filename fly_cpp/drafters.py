"""Drafters: who proposes the next tokens. Each owns its own state (and KV cache).

Interface: ``draft(committed, limit) -> list[int]`` returns at most ``limit`` greedy guesses
that continue ``committed`` (the prompt plus every token emitted so far). Any object with that
method can draft (``Engine.generate(..., drafter=...)``). A draft may be
shorter, even empty: it stops after an end-of-generation token, or when the draft model is
unsure (``p_min``), or when the n-gram drafter finds no match.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fly_cpp import ngram, rows
from fly_cpp._llama import Context
from fly_cpp.config import SpecSettings


class Drafter(Protocol):
    def draft(self, committed: Sequence[int], limit: int) -> list[int]: ...


class NgramDrafter:
    """Prompt lookup alone: guesses copied from earlier in the context, no model."""

    def __init__(self, spec: SpecSettings) -> None:
        self.spec = spec

    def draft(self, committed: Sequence[int], limit: int) -> list[int]:
        return ngram.lookup(committed, self.spec.ngram_max, min(self.spec.ngram_tokens, limit))


class ModelDrafter:
    """Greedy drafting with a draft model, optionally multi-level: an n-gram guess is first
    checked by the draft model in one forward pass (exact match, plus the draft's own next
    token), so one draft forward pass can yield several draft tokens."""

    def __init__(self, ctx: Context, n_vocab: int, spec: SpecSettings) -> None:
        self.ctx = ctx
        self.n_vocab = n_vocab  # argmax only over ids the target knows
        self.spec = spec

    def draft(self, committed: Sequence[int], limit: int) -> list[int]:
        spec, ctx, model = self.spec, self.ctx, self.ctx.model
        ctx.sync(committed)
        out: list[int] = []
        history = list(committed)
        while len(out) < limit:
            room = min(spec.ngram_tokens, limit - len(out) - 1, ctx.n_batch - 1)  # guess + last token fit one batch
            guess = ngram.lookup(history, spec.ngram_max, room) if spec.ngram and room > 0 else []
            logits = ctx.decode([history[-1], *guess], logits="all")
            best = rows.argmax(logits[:, : self.n_vocab])  # (len(guess)+1,)
            agree = 0
            while agree < len(guess) and guess[agree] == best[agree]:
                agree += 1
            new = [*guess[:agree]]
            if spec.p_min <= 0 or rows.top_probability(logits[agree : agree + 1])[0] >= spec.p_min:
                new.append(int(best[agree]))
            out += new
            history += new
            ctx.truncate(len(history) - 1)  # invariant: KV holds history[:-1]
            ends = [i for i, t in enumerate(new) if model.is_eog(t)]
            if ends or len(new) == agree:  # end of text, or the draft lost confidence
                if ends:
                    cut = len(out) - len(new) + ends[0] + 1
                    del out[cut:]
                break
        return out[:limit]

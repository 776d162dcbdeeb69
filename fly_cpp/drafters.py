"""Drafters: who proposes the next tokens. Each owns its own state (and KV cache).

Interface: ``draft(committed, limit) -> list[int]`` returns at most ``limit`` greedy guesses
that continue ``committed`` (the prompt plus every token emitted so far). Any object with that
method can draft (``Engine.generate(..., drafter=...)``). A draft may be
shorter, even empty: it stops after an end-of-generation token, or when the draft model is
unsure (``p_min``), or when the n-gram drafter finds no match.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any, Protocol

from fly_cpp import ngram, rows
from fly_cpp._llama import Context, common_prefix
from fly_cpp.config import SpecSettings
from fly_cpp.sampling import NO_BIAS, LogitBias


class Drafter(Protocol):
    def draft(self, committed: Sequence[int], limit: int) -> list[int]: ...


class NgramDrafter:
    """Prompt lookup alone: guesses copied from earlier in the context, no model (a guess
    ends before a token the logit bias bans)."""

    def __init__(self, spec: SpecSettings, bias: LogitBias = NO_BIAS) -> None:
        self.spec = spec
        self.bias = bias
        self.index = ngram.Index(spec.ngram_max)

    def draft(self, committed: Sequence[int], limit: int) -> list[int]:
        return self.bias.cut(self.index.match(committed, min(self.spec.ngram_tokens, limit))[1])


class ModelDrafter:
    """Greedy drafting with a draft model, optionally multi-level: an n-gram guess is first
    checked by the draft model in one forward pass (exact match, plus the draft's own next
    token), so one draft forward pass can yield several draft tokens. The tokens its cache lags
    behind (the catch-up) go into the same decode as the first draft step.

    With a ``pacer`` (cost-aware speculation, ``fly_cpp.pacing``) the draft stops when one more
    step is not worth its cost, and trailing tokens not worth verifying are left out; the
    draft's confidence in each drafted token is kept in ``confidences``. The draft's
    choices see the generation's logit bias, as the target's do."""

    def __init__(self, ctx: Context, n_vocab: int, spec: SpecSettings, bias: LogitBias = NO_BIAS) -> None:
        self.ctx = ctx
        self.n_vocab = n_vocab  # argmax only over ids the target knows
        self.spec = spec
        self.bias = bias
        self.confidences: list[float | None] = []
        self.first_confidence: float | None = None  # of the first drafted token, before trimming
        self.left_out: tuple[int, float] | None = None  # the first token trimming left out, and its confidence
        self.index = ngram.Index(spec.ngram_max)

    def lag(self, committed: Sequence[int]) -> int:
        """Tokens this draft's cache must catch up on before drafting after ``committed``."""
        return len(committed) - 1 - common_prefix(self.ctx.tokens, committed[:-1])

    def draft(self, committed: Sequence[int], limit: int, pacer: Any = None, confident: bool = False) -> list[int]:
        """Up to ``limit`` tokens; ``confident``: also keep the draft's confidence in each
        (``confidences``), as a ``pacer`` needs."""
        spec, ctx, model = self.spec, self.ctx, self.ctx.model
        keep = common_prefix(ctx.tokens, committed[:-1])
        ctx.truncate(keep)  # unconditional: also drops anything a disturbed decode left behind
        ctx.checkpoint(len(committed) - 1)  # the next round comes back here (a recurrent state needs a copy)
        catchup = list(committed[keep:-1])  # decoded with the first step: KV then holds committed[:-1]
        out: list[int] = []
        confidences: list[float] = []
        chances: list[float] = []  # pacer: the chance that drafted tokens 0..i are all kept
        history = list(committed)
        want_confidence = confident or pacer is not None or spec.p_min > 0
        while len(out) < limit:
            t0 = perf_counter()
            room = min(spec.ngram_tokens, limit - len(out) - 1, ctx.n_batch - 1)  # guess + last token fit one batch
            found = self.index.match(history, room)[1] if spec.ngram and room > 0 else []
            guess = found  # check only as much of the guess as pays
            if pacer is not None and found:
                guess = found[: pacer.guess_length(len(found), len(catchup))]
            batch = [*catchup, history[-1], *guess]
            logits = ctx.decode(batch, logits=len(guess) + 1)
            catchup = []
            if self.bias:
                logits = self.bias.apply(logits[:, : self.n_vocab])
            best = rows.argmax(logits[:, : self.n_vocab])  # (len(guess)+1,)
            agree = 0
            while agree < len(guess) and guess[agree] == best[agree]:
                agree += 1
            if pacer is not None and found:
                pacer.guess_checked(found, len(guess), agree, int(best[agree]))
            sure = [float(p) for p in rows.top_probability(logits[: agree + 1])] if want_confidence else []
            new = [*guess[:agree]]
            if spec.p_min <= 0 or sure[agree] >= spec.p_min:
                new.append(int(best[agree]))
            out += new
            history += new
            confidences += sure[: len(new)]
            ctx.truncate(len(history) - 1)  # invariant: KV holds history[:-1]
            if pacer is not None:  # a draft step's cost, with its host work
                pacer.costs.observe_draft(len(batch), perf_counter() - t0)
            ends = [i for i, t in enumerate(new) if model.is_eog(t)]
            if ends or len(new) == agree:  # end of text, or the draft lost confidence
                if ends:
                    cut = len(out) - len(new) + ends[0] + 1
                    del out[cut:]
                break
            if pacer is not None:
                for q in sure[: len(new)]:
                    chances.append((chances[-1] if chances else 1.0) * pacer.model(q))
                # the next tokens are likely as predictable as the last one was
                if not pacer.more(chances, pacer.model(sure[len(new) - 1] if sure else None)):
                    break
        out = out[:limit]
        self.left_out = None
        if pacer is not None:
            while len(chances) < len(out):  # tokens after the last decision (end of text, limit)
                q = confidences[len(chances)] if len(chances) < len(confidences) else None
                chances.append((chances[-1] if chances else 1.0) * pacer.model(q))
            n = pacer.trim(chances[: len(out)])
            self.left_out = (out[n], confidences[n]) if n < len(out) and n < len(confidences) else None
            out = out[:n]
        self.confidences = list(confidences[: len(out)])
        self.first_confidence = confidences[0] if confidences else None
        return out

"""How good a draft is for a target, and what a forward pass costs, measured with llama.cpp.

- ``greedy_agreement``: the target writes a greedy continuation of each prompt; both models then
  read prompt + continuation in one batch (teacher forcing on the target's text), and we count
  the positions of the continuation where the draft's greedy token equals the target's. This is
  the per-token exact-match rate speculative decoding sees.
- ``decode_ms``: median wall time of one single-token decode after a short prompt.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.engine.vocab import check_compatible

PathLike = str | os.PathLike[str]

PROMPTS = (
    "Once upon a time, there was a little girl named Lily. She",
    "Tom and his dog went to the park. The dog",
    "The sun was hot and the children wanted to",
    "One day, a big bird flew over the town and",
)


@dataclass(frozen=True)
class Agreement:
    matches: int
    positions: int
    per_prompt: tuple[float, ...] = field(default=())

    @property
    def rate(self) -> float:
        return self.matches / self.positions if self.positions else float("nan")


def _threads(n_threads: int) -> int:
    return n_threads or os.cpu_count() or 1


def target_continuation(ctx: Context, prompt_tokens: list[int], n_tokens: int) -> list[int]:
    """The target's greedy continuation (stops after an end-of-generation token)."""
    ctx.truncate(0)
    logits = ctx.decode(prompt_tokens, "last")
    out: list[int] = []
    for _ in range(n_tokens):
        token = int(np.argmax(logits[0]))
        out.append(token)
        if ctx.model.is_eog(token) or len(out) == n_tokens:
            break
        logits = ctx.decode([token], "last")
    return out


def _greedy_rows(ctx: Context, tokens: list[int], first: int) -> np.ndarray:
    """Greedy token after each position >= first - 1 of ``tokens``: shape (len(tokens) - first,)."""
    ctx.truncate(0)
    logits = ctx.decode(tokens, "all")  # (len(tokens), n_vocab) float32
    return np.argmax(logits[first - 1 : len(tokens) - 1], axis=1)


def greedy_agreement(target: PathLike | Model, draft: PathLike | Model,
                     prompts: Sequence[str] = PROMPTS, *, n_tokens: int = 48, n_ctx: int = 512,
                     n_threads: int = 0) -> Agreement:
    """Fraction of positions of the target's greedy text where the draft's greedy token
    equals the target's (teacher-forced on the target's text)."""
    owned: list[Model] = []

    def load(m: PathLike | Model) -> Model:
        if isinstance(m, Model):
            return m
        owned.append(Model(m))
        return owned[-1]

    try:
        t_model, d_model = load(target), load(draft)
        check_compatible(t_model, d_model)
        threads = _threads(n_threads)
        per_prompt, matches, positions = [], 0, 0
        with Context(t_model, n_ctx=n_ctx, n_threads=threads) as t_ctx, \
                Context(d_model, n_ctx=n_ctx, n_threads=threads) as d_ctx:
            for prompt in prompts:
                prompt_tokens = t_model.tokenize(prompt)
                text = prompt_tokens + target_continuation(t_ctx, prompt_tokens, n_tokens)
                first = len(prompt_tokens)
                t_greedy = _greedy_rows(t_ctx, text, first)
                d_greedy = _greedy_rows(d_ctx, text, first)
                hits = int(np.sum(t_greedy == d_greedy))
                matches += hits
                positions += len(t_greedy)
                per_prompt.append(hits / max(len(t_greedy), 1))
        return Agreement(matches, positions, tuple(per_prompt))
    finally:
        for m in owned:
            m.close()


def decode_ms(model: PathLike | Model, *, n_tokens: int = 24, n_ctx: int = 256, n_threads: int = 0,
              prompt: str = "Once upon a time") -> float:
    """Median milliseconds of one single-token decode (after a short prompt and one warm-up)."""
    m = model if isinstance(model, Model) else Model(model)
    try:
        with Context(m, n_ctx=n_ctx, n_threads=_threads(n_threads)) as ctx:
            logits = ctx.decode(m.tokenize(prompt), "last")
            times = []
            for _ in range(n_tokens + 1):
                token = int(np.argmax(logits[0]))
                start = time.perf_counter()
                logits = ctx.decode([token], "last")
                times.append(time.perf_counter() - start)
            return 1000.0 * statistics.median(times[1:])
    finally:
        if m is not model:
            m.close()


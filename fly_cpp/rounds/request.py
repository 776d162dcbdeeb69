"""What one generation is asked to do, frozen before its first token.

The engine validates a request (prompt fits, token ids exist, settings are consistent) when it
makes one; the loop, the verifier and the output read it and never change it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fly_cpp.backend.sampling import NO_BIAS, LogitBias, Sampler, draft_sampler
from fly_cpp.config import SamplingSettings
from fly_cpp.rounds.rules import RoundRules


@dataclass(frozen=True)
class Shift:
    """``keep``: positions kept at the start (llama-server's n_keep, BOS included); ``discard``:
    positions dropped after them per shift (0: half of the rest, as llama-server)."""

    keep: int = 1
    discard: int = 0

    def span(self, n_ctx: int, held: int) -> tuple[int, int]:
        """(kept, dropped) for a cache of ``n_ctx`` holding ``held`` tokens, as llama-server
        clamps them: at least 4 positions past ``kept``, at least one token left after the drop."""
        keep = max(0, min(self.keep, n_ctx - 4))
        left = held - keep
        return keep, max(0, min(self.discard or left // 2, left - 1))


@dataclass(frozen=True)
class Request:
    """prompt: the token ids to continue. rules: how its rounds run (``fly_cpp.rounds.rules``,
    resolved from its settings). max_tokens: the most tokens to emit (0 = none).
    stop: strings that end the text (not emitted). seed: the sampler's seed, fixed here so a
    request can be replayed exactly. bias: the sampling settings' logit_bias and ignore_eos,
    resolved to token ids. n_probs: the target's top-n log-probabilities to report with every
    emitted token (0 = none). cache_prompt: reuse what the KV caches hold in common with the
    prompt (False: both caches start empty). shift: what a text that fills the context does
    (``fly_cpp.rounds.shift``; None: it ends there)."""

    prompt: tuple[int, ...]
    rules: RoundRules
    sampling: SamplingSettings
    max_tokens: int
    stop: tuple[str, ...]
    seed: int
    bias: LogitBias = NO_BIAS
    n_probs: int = 0
    cache_prompt: bool = True
    shift: Shift | None = None

    def under(self, rules: RoundRules) -> Request:
        """This request with its rounds run by ``rules`` (as its slot settled them)."""
        return dataclasses.replace(self, rules=rules)

    def draft_sampler(self) -> Sampler | None:
        """How a draft drafts for this request (``fly_cpp.backend.sampling.draft_sampler``)."""
        return draft_sampler(self.sampling, self.seed, self.bias, len(self.prompt))

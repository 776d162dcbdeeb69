"""A request admitted: every check a generation's settings get before any token (the prompt
fits and its ids exist, the mode has someone to draft, the caches can go back, a lost rpc
server), and the request frozen with what its rounds need (logit bias, seed, grammar). An error
here is a ``FlyError`` raised by ``Engine.generate`` itself, before the generation exists."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fly_cpp.backend.grammar import Grammar, gbnf
from fly_cpp.backend.sampling import LogitBias
from fly_cpp.basics.errors import ContextExceeded, FlyError
from fly_cpp.config import SamplingSettings, SpecSettings
from fly_cpp.engine.loading import Loaded, check_rollback
from fly_cpp.rounds.constrain import Lazy, Rules
from fly_cpp.rounds.request import Request, Shift
from fly_cpp.rounds.rules import RoundRules


@dataclass(frozen=True)
class Admitted:
    """The frozen request, its grammar's state before the first token (None: unconstrained),
    and how a token is spelled in its text (special tokens it preserves included)."""
    request: Request
    rules: Rules | None
    piece: Callable[[int], bytes]


def check_tokens(n_vocab: int, tokens: Sequence[int], what: str = "token id") -> None:
    if bad := [t for t in tokens if not 0 <= t < n_vocab]:
        raise FlyError(f"{what} {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")


def admit(pair: Loaded, tokens: list[int], n_ctx: int, spec: SpecSettings, sampling: SamplingSettings,
          max_tokens: int, stop: Sequence[str], own_drafter: bool, n_probs: int, cache_prompt: bool,
          shift: Shift | None) -> Admitted:
    """``tokens``, the prompt; ``own_drafter``: no drafter was handed in (the pair's drafts);
    ``shift``: None where the caches cannot shift."""
    model = pair.target_model
    if not tokens:
        raise FlyError("the prompt is empty")
    if len(tokens) > n_ctx:
        raise ContextExceeded(len(tokens), n_ctx)
    check_tokens(model.n_vocab, tokens)
    if max_tokens < 0:
        raise FlyError(f"max_tokens must be >= 0, got {max_tokens}")
    drafts = spec.mode != "target"
    if drafts and own_drafter and spec.spec_type == "draft-mtp" and pair.mtp_ctx is None:
        why = "a draft model is loaded (leave out -d)" if pair.draft_ctx is not None else f"{model.name} has no MTP layers"
        raise FlyError(f"--spec-type draft-mtp drafts with the target's own MTP head: {why}")
    if drafts and own_drafter and pair.draft_ctx is None and pair.mtp_ctx is None and not spec.ngram:
        raise FlyError(f"mode {spec.mode} needs a draft model or n-gram lookup")
    if drafts and own_drafter and spec.draft_tree and (pair.target is None or not pair.target.branches):
        raise FlyError("draft_tree needs an engine loaded for trees (the CLI's --draft-tree, Engine(branches=True)) "
                       "with a draft model (-md), one slot, a KV cache and flash attention (not -fa off)")
    if drafts and pair.target is not None:
        check_rollback(pair.target)
        # a round verifies at most n_batch rows (the loop's limit): those fit whatever the buffers
        if pair.target.n_outputs and min(spec.max_draft, pair.target.n_batch - 1) + 1 > pair.target.n_outputs:
            raise FlyError(f"k {spec.max_draft} drafts more than this engine was loaded for (at most "
                           f"{pair.target.n_outputs - 1} a round: load it with a longer max_draft, the CLI's "
                           "--k or --k-max, as llama-server's --draft-max sizes its contexts)")
    for m in (model, pair.draft_model):
        if m is not None:
            m.check()  # a lost rpc-server: refuse before any token (HTTP 503 in the server)
    if isinstance(n_probs, bool) or not isinstance(n_probs, int) or n_probs < 0:
        raise FlyError(f"n_probs must be an integer >= 0, got {n_probs!r}")
    check_tokens(model.n_vocab, [t for t, _ in sampling.logit_bias], what="logit_bias token")
    bias = LogitBias(sampling.logit_bias, model.eog_ids if sampling.ignore_eos else ())
    rules: Rules | None = Grammar(model, gbnf(sampling)) if sampling.constrained else None
    piece = model.piece_keeping(sampling.preserved_tokens)
    if rules is not None and sampling.grammar_trigger:
        rules = Lazy(rules, sampling.grammar_trigger, model.tokenize, piece=piece)
    seed = sampling.seed if sampling.seed is not None else secrets.randbits(32)
    request = Request(tuple(tokens), RoundRules.of(spec), sampling, max_tokens, tuple(stop), seed, bias,
                      min(n_probs, model.n_vocab), cache_prompt, shift)
    return Admitted(request, rules, piece)

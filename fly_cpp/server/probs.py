"""``n_probs``: llama-server's ``completion_probabilities`` entries.

The values come with each emitted token from the target pass that verified it
(``Step.probs``): the target's own distribution (softmax of its raw logits, before sampling
settings), as llama-server reports with ``post_sampling_probs`` off; under FLy a loosely
accepted token shows how unlikely the target found it. Streams carry them per token.

With ``post_sampling_probs`` the entries are probabilities after the request's sampler chain
(top-k, top-p, min-p, temperature: what the target's draw picks from), ``prob`` and
``top_probs``, as llama-server gives them: the chain runs on the target's raw top entries, so
the generation is asked for at least top-k of them (``raw_needed``). A token outside the
chain's survivors (a loosely accepted one) has probability 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fly_cpp.backend.sampling import Sampler
from fly_cpp.config import SamplingSettings
from fly_cpp.rounds.step import TokenProbs


def entries(piece: Callable[[int], bytes], tokens: Sequence[int], probs: Sequence[TokenProbs | None],
            n: int, post: SamplingSettings | None = None) -> list[dict[str, Any]]:
    """One entry per token: its id, text, bytes and logprob, and the n most likely there (``post``:
    the request's sampling settings, for probabilities after its chain)."""
    out = []
    for token, p in zip(tokens, probs):
        if p is None:
            continue
        if post is not None:
            ids, chained = _after_chain(p, post)
            entry = _token(piece, token, float(chained[ids == token].sum()), "prob")
            entry["top_probs"] = [_token(piece, int(t), float(q), "prob") for t, q in zip(ids[:n], chained[:n])]
        else:
            entry = _token(piece, token, p.logprob)
            entry["top_logprobs"] = [_token(piece, t, lp) for t, lp in p.top[:n]]
        out.append(entry)
    return out


def raw_needed(n_probs: int, top_k: int, n_vocab: int) -> int:
    """How many raw top entries a generation must report for ``n_probs`` after the chain."""
    return max(n_probs, top_k if 0 < top_k < n_vocab else n_vocab)


def _after_chain(p: TokenProbs, settings: SamplingSettings) -> tuple[np.ndarray, np.ndarray]:
    """(ids (m,), probs (m,)) the chain keeps from the raw top entries, most likely first."""
    ids = np.array([t for t, _ in p.top], dtype=np.int64)
    if settings.greedy or ids.size <= 1:
        return ids[:1], np.ones(min(ids.size, 1))
    row = np.full(int(ids.max()) + 1, -np.inf, dtype=np.float32)  # (max id + 1,) logits up to a constant
    row[ids] = [lp for _, lp in p.top]
    kept, probs = Sampler(settings, 0).distribution_numpy(row, ())
    return kept[probs > 0], probs[probs > 0]


def _token(piece: Callable[[int], bytes], token: int, value: float, name: str = "logprob") -> dict[str, Any]:
    raw = piece(token)
    return {"id": token, "token": raw.decode("utf-8", "replace"), "bytes": list(raw), name: value}

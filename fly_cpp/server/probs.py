"""``n_probs``: llama-server's ``completion_probabilities`` entries.

The values come with each emitted token from the target pass that verified it
(``Step.probs``): the target's own distribution (softmax of its raw logits, before sampling
settings), as llama-server reports with ``post_sampling_probs`` off; under FLy a loosely
accepted token shows how unlikely the target found it. Streams carry them per token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fly_cpp.step import TokenProbs


def entries(piece: Callable[[int], bytes], tokens: Sequence[int], probs: Sequence[TokenProbs | None],
            n: int) -> list[dict[str, Any]]:
    """One entry per token: its id, text, bytes and logprob, and the n most likely there."""
    out = []
    for token, p in zip(tokens, probs):
        if p is None:
            continue
        entry = _token(piece, token, p.logprob)
        entry["top_logprobs"] = [_token(piece, t, lp) for t, lp in p.top[:n]]
        out.append(entry)
    return out


def _token(piece: Callable[[int], bytes], token: int, logprob: float) -> dict[str, Any]:
    raw = piece(token)
    return {"id": token, "token": raw.decode("utf-8", "replace"), "bytes": list(raw), "logprob": logprob}

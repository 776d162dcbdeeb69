"""``n_probs``: the target's top-n probabilities at each generated token.

The rounds of a generation see the target's logits only a batch at a time and keep none of
them, so the probabilities come afterwards from the engine's teacher-forced scoring pass
(``Engine.score``, one prompt-processing pass over the output, not a generation). They are the
target's own distribution (softmax of its raw logits, before sampling settings), as
llama-server reports with ``post_sampling_probs`` off; under FLy a loosely accepted token
shows how unlikely the target found it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fly_cpp.engine import Engine


def top_logprobs(engine: Engine, prompt: Sequence[int], output: Sequence[int], n: int) -> list[dict[str, Any]]:
    """One entry per output token: its id, text, bytes and logprob, and the n most likely."""
    if not output or n <= 0:
        return []
    score = engine.score(prompt, output, top_n=n)
    out = []
    for token, logprob, ids, values in zip(output, score.logprobs, score.top_ids, score.top_logprobs):
        entry = _token(engine, int(token), float(logprob))
        entry["top_logprobs"] = [_token(engine, int(t), float(v)) for t, v in zip(ids, values)]
        out.append(entry)
    return out


def _token(engine: Engine, token: int, logprob: float) -> dict[str, Any]:
    piece = engine.piece(token)
    return {"id": token, "token": piece.decode("utf-8", "replace"), "bytes": list(piece), "logprob": logprob}

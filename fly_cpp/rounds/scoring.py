"""Teacher-forced scoring: how likely a model finds a given continuation of a prompt.

One pass decodes prompt + output in batches of n_batch with logits for every row (reusing the
cached common prefix) and reduces each row as it comes, two ways: the log-probability of the
output token there (its NLL, for the bench's fidelity) and the n most likely tokens (for the
server's ``n_probs``). It costs about one prompt-processing pass over the output. Values are
the model's own distribution: the softmax of its raw logits, before any sampling settings.
The cache is left holding a prefix of prompt + output; generations re-sync it by common prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fly_cpp.backend.cache import common_prefix
from fly_cpp.backend.context import Context
from fly_cpp.backend.rows import logsumexp
from fly_cpp.rounds.step import TokenProbs

ROW_BLOCK = 32  # rows reduced at a time: bounds the float64 copy at 32 x n_vocab


@dataclass(frozen=True)
class Score:
    """Per output token: ``logprobs`` (n,) its log-probability; ``top_ids`` / ``top_logprobs``
    (n, top_n) the most likely tokens there, most likely first."""

    logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray

    @property
    def nll(self) -> float | None:
        """Mean negative log-likelihood in nats per token (None for an empty output)."""
        return float(-self.logprobs.mean()) if len(self.logprobs) else None


def score(ctx: Context, prompt: Sequence[int], output: Sequence[int], top_n: int = 0) -> Score:
    """Score ``output`` after ``prompt`` under ``ctx``'s model (output cut at the context's end)."""
    seq = [*prompt, *output][: ctx.n_ctx]
    start = len(prompt) - 1  # the row whose logits predict output[0]
    logprobs: list[np.ndarray] = []
    top_ids: list[np.ndarray] = []
    top_logprobs: list[np.ndarray] = []
    pos = min(common_prefix(ctx.tokens, seq), start)
    ctx.truncate(pos)
    while pos < len(seq) - 1:  # the last token predicts nothing we need
        chunk = seq[pos : min(pos + (ctx.n_outputs or ctx.n_batch), len(seq) - 1)]  # rows its buffers hold
        logits = ctx.decode(chunk, logits="all")  # (len(chunk), n_vocab) view, valid until the next decode
        for lo in range(max(start - pos, 0), len(chunk), ROW_BLOCK):
            rows = logits[lo : lo + ROW_BLOCK]  # row i predicts seq[pos + lo + i + 1]
            targets = np.asarray(seq[pos + lo + 1 : pos + lo + 1 + len(rows)], dtype=np.int64)
            lp, ids, vals = _reduce(rows, targets, top_n)
            logprobs.append(lp)
            if top_n > 0:
                top_ids.append(ids)
                top_logprobs.append(vals)
        pos += len(chunk)
    n = top_n if top_n > 0 else 0
    return Score(np.concatenate(logprobs) if logprobs else np.zeros(0),
                 np.concatenate(top_ids) if top_ids else np.zeros((0, n), dtype=np.int64),
                 np.concatenate(top_logprobs) if top_logprobs else np.zeros((0, n)))


def _reduce(rows: np.ndarray, targets: np.ndarray, top_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(r, V) logits and (r,) token ids -> (r,) their log-probabilities, and (r, n) the top-n
    ids and log-probabilities per row, most likely first (n = min(top_n, V); 0 gives empty)."""
    lse = logsumexp(rows)  # (r,)
    logprobs = rows[np.arange(len(rows)), targets] - lse
    n = min(max(top_n, 0), rows.shape[1])
    if n == 0:
        return logprobs, np.zeros((len(rows), 0), dtype=np.int64), np.zeros((len(rows), 0))
    ids = np.argpartition(-rows, n - 1, axis=1)[:, :n]  # (r, n), unordered
    vals = np.take_along_axis(rows, ids, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return logprobs, np.take_along_axis(ids, order, axis=1), np.take_along_axis(vals, order, axis=1) - lse[:, None]


def token_probs(rows: np.ndarray, tokens: Sequence[int], top_n: int) -> list[TokenProbs]:
    """The target's probabilities at emitted tokens, from the rows that predicted them (row i
    predicts ``tokens[i]``): what a generation reports with ``n_probs``."""
    lp, ids, vals = _reduce(rows[: len(tokens)], np.asarray(tokens, dtype=np.int64), top_n)
    return [TokenProbs(float(lp[i]), tuple(zip(ids[i].tolist(), vals[i].tolist()))) for i in range(len(tokens))]

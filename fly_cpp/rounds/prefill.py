"""The prompt's decode before the first round, in the batches llama-server decodes it in: from
the first token the target's cache lacks, ``n_batch`` tokens at a time, the last batch ending
at the prompt's end. Each batch is reported as it ends (``Progress``).

The last batch ends differently by path: where the first token comes from the prompt's own
last row (``Runs.start``) it is decoded here whole; otherwise the loop's invariant leaves the
prompt's last token to the first round, whose decode finishes that batch and reports it
(``fly_cpp.rounds.loop``). Either way there is one report per llama-server batch, plus the one before
any decode.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from time import perf_counter

import numpy as np

from fly_cpp.backend.batch import Seq
from fly_cpp.backend.cache import common_prefix
from fly_cpp.backend.context import Context
from fly_cpp.rounds.output import Output
from fly_cpp.rounds.runs import Runs
from fly_cpp.rounds.step import Progress


def prefill(committed: list[int], target: Context | Seq, first: Runs | None, out: Output,
            begin: float, open_at: Callable[[np.ndarray, int], bool] | None = None) -> Generator[Progress, None, bool]:
    """Bring ``target`` to the loop's invariant for ``committed`` (the prompt), or through its
    last token with ``first`` (which then commits the first token unless ``open_at`` leaves it
    to the first round: ``Runs.start``), reporting each batch. Returns whether it did."""
    total, cached = len(committed), out.stats.n_cached
    yield Progress(total, cached, cached, 0.0)
    target.truncate(common_prefix(target.tokens, committed[:-1]))
    at = len(target.tokens)
    while total - at > target.n_batch:  # a whole batch, and more of the prompt after it
        target.decode(committed[at:at + target.n_batch], logits="none")
        at += target.n_batch
        yield Progress(total, cached, at, perf_counter() - begin)
    if first is not None:
        taken = first.start(committed, out, open_at)
        yield Progress(total, cached, total, perf_counter() - begin)
        return taken
    target.sync(committed)  # all but the last token: the first round decodes it
    return False

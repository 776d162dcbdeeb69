"""Teacher-forced scoring (fly_cpp.rounds.scoring): one pass, two reductions (NLL and top-n)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.rounds.scoring import score


def test_nll_chunked_equals_whole_and_prefers_greedy(stories: Path) -> None:
    with Model(stories) as model, Context(model, n_ctx=256, n_threads=2, n_batch=256) as whole, \
            Context(model, n_ctx=256, n_threads=2, n_batch=7) as chunked:
        prompt = model.tokenize("Once upon a time, there was a little girl")
        greedy = []
        for _ in range(24):  # the target's own greedy continuation
            logits = whole.decode([*prompt, *greedy][len(whole.tokens):], logits="last")
            greedy.append(int(np.argmax(logits[0])))
        other = model.tokenize(" banana banana car sky blue the the", add_special=False)
        a = score(whole, prompt, greedy).nll
        b = score(chunked, prompt, greedy).nll
        assert a == pytest.approx(b, rel=1e-3)
        assert score(whole, prompt, other).nll > a
        assert score(whole, prompt, greedy).nll == pytest.approx(a, rel=1e-5)  # reused cache
        assert score(whole, prompt, []).nll is None


def test_top_n_and_logprobs_match_a_full_log_softmax(stories: Path) -> None:
    with Model(stories) as model, Context(model, n_ctx=256, n_threads=1, n_batch=5) as ctx, \
            Context(model, n_ctx=256, n_threads=1, n_batch=256) as ref:
        prompt = model.tokenize("Once upon a time")
        output = model.tokenize(" there was a dog named Tim", add_special=False)
        got = score(ctx, prompt, output, top_n=4)
        logits = np.array(ref.decode([*prompt, *output], logits="all"), dtype=np.float64)  # (n, V)
        x = logits[len(prompt) - 1 : -1]  # rows predicting each output token
        logp = x - (x.max(1, keepdims=True) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)))
        assert got.logprobs == pytest.approx(logp[np.arange(len(output)), output], abs=1e-3)
        assert got.top_ids.shape == got.top_logprobs.shape == (len(output), 4)
        assert (np.diff(got.top_logprobs, axis=1) <= 0).all()  # most likely first
        for row, ids, values in zip(logp, got.top_ids, got.top_logprobs):
            assert values == pytest.approx(row[ids], abs=1e-3) and set(ids) == set(np.argsort(-row)[:4])

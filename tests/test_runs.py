"""Target-only greedy runs (fly_cpp.rounds.runs): decoded in the native library, the same text as token
by token, on real llama.cpp contexts."""

from __future__ import annotations

import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend import native
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.rounds.request import Request
from fly_cpp.rounds.rules import RoundRules
from fly_cpp.rounds.runs import Runs

pytestmark = pytest.mark.skipif(not native.has_greedy_run(), reason=f"no native greedy runs: {native.status()}")
TARGET = SpecSettings(mode="target")
GREEDY = SamplingSettings(temperature=0)


@pytest.fixture(scope="module")
def engine(stories):
    with Engine(ModelSettings(str(stories), n_ctx=256)) as e:
        yield e


def _both(engine, prompt, **kw):
    """The generation with runs, and token by token (the library switched off)."""
    fast = engine.generate(prompt, spec=TARGET, sampling=GREEDY, **kw).run()
    with native.enabled(False):
        assert not engine.target.runs_natively
        slow = engine.generate(prompt, spec=TARGET, sampling=GREEDY, **kw).run()
    return fast, slow


def test_the_engine_runs_target_only_greedy_natively(engine):
    assert engine.target.runs_natively
    request = Request(tuple(engine.tokenize("Once")), RoundRules.of(TARGET), GREEDY, 8, (), 0)
    assert Runs.make(request, engine.target, drafting=False, constrained=False) is not None
    for changed in (SamplingSettings(temperature=0.7), SamplingSettings(temperature=0, repeat_penalty=1.1)):
        assert Runs.make(Request(request.prompt, RoundRules.of(TARGET), changed, 8, (), 0), engine.target, False, False) is None
    # with a drafter, the rounds it leaves to the target alone run where verification is exact
    assert Runs.make(request, engine.target, drafting=True, constrained=False) is not None
    loose = Request(request.prompt, RoundRules.of(SpecSettings(mode="fly", loosen="on")), GREEDY, 8, (), 0)
    assert Runs.make(loose, engine.target, drafting=True, constrained=False) is None
    assert Runs.make(request, engine.target, drafting=False, constrained=True) is None


@pytest.mark.parametrize("n", [1, 2, 7, 150])
def test_runs_write_the_token_by_token_text(engine, n):
    fast, slow = _both(engine, "Once upon a time", max_tokens=n)
    assert fast.tokens == slow.tokens and len(fast.tokens) == n
    assert fast.finish_reason == slow.finish_reason == "length"
    assert fast.stats.n_rounds == slow.stats.n_rounds == n  # one round per token either way


def test_a_stop_string_inside_a_run_ends_the_text_there(engine):
    full = engine.generate("Once upon a time", spec=TARGET, sampling=GREEDY, max_tokens=120).run().text
    word = full.split()[12]
    fast, slow = _both(engine, "Once upon a time", max_tokens=120, stop=[word])
    assert fast.text == slow.text == full[: full.index(word)] and fast.finish_reason == "stop"
    # the tokens a run decoded past the stop are rolled back: the next request reuses the cache
    again, ref = _both(engine, "Once upon a time there", max_tokens=40)
    assert again.tokens == ref.tokens


def test_end_of_generation_ends_a_run(period_is_eos):
    with Engine(ModelSettings(str(period_is_eos), n_ctx=256)) as e:
        fast, slow = _both(e, "Once upon a time", max_tokens=200)
        assert fast.tokens == slow.tokens and fast.finish_reason == slow.finish_reason == "stop"
        assert fast.stats.n_eog == 1


def test_a_full_context_stops_a_run_cleanly(stories):
    with Engine(ModelSettings(str(stories), n_ctx=64)) as e:
        fast, slow = _both(e, "Once upon a time", max_tokens=200)
        assert fast.tokens == slow.tokens and fast.stats.n_tokens < 64
        assert fast.finish_reason == slow.finish_reason == "length"


def test_greedy_run_leaves_the_cache_as_decoding_does(stories):
    model = Model(stories)
    try:
        a, b = Context(model, n_ctx=128, n_threads=1), Context(model, n_ctx=128, n_threads=1)
        prompt = model.tokenize("Once upon a time")
        a.decode(prompt[:-1], logits="none")
        b.decode(prompt[:-1], logits="none")
        got = a.greedy_run(prompt[-1], 20, None)
        tok, ref = prompt[-1], []
        for _ in range(20):
            tok = int(b.decode([tok], logits="last")[0].argmax())
            ref.append(tok)
        assert got == ref and a.tokens == b.tokens
        assert len(a.tokens) == len(prompt) + 19  # the last token picked is not decoded
        # what follows the run is what follows token-by-token decoding
        nxt = a.decode([got[-1]], logits="last")[0].argmax()
        assert int(nxt) == int(b.decode([ref[-1]], logits="last")[0].argmax())
        a.close()
        b.close()
    finally:
        model.close()

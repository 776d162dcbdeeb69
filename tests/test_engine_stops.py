"""Stop conditions, streaming text, and KV-cache rollback on real llama.cpp contexts."""

from __future__ import annotations

import pytest

from conftest import make_once
from fly_cpp import Engine, FlyError, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.models import make

GREEDY = SamplingSettings(temperature=0)


@pytest.fixture(scope="module")
def pair(stories, stories_draft):
    with Engine(ModelSettings(str(stories), n_ctx=512, n_ubatch=1), ModelSettings(str(stories_draft))) as e:
        yield e


@pytest.mark.parametrize("mode", ["target", "spd", "fly"])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 33])
def test_max_tokens_is_exact(pair, mode, n):
    gen = pair.generate("Once upon a time", spec=SpecSettings(mode=mode), sampling=GREEDY, max_tokens=n).run()
    assert len(gen.tokens) == gen.stats.n_tokens == n
    assert gen.finish_reason == "length"


def test_streamed_steps_make_up_the_text(pair):
    gen = pair.generate("Once upon a time", sampling=GREEDY, max_tokens=80)
    steps = list(gen)
    assert "".join(s.text for s in steps) == gen.text == pair.detokenize(gen.tokens)
    assert [s.token for s in steps] == gen.tokens
    assert all(s.drafted for s in steps if s.loose)
    assert max(s.round for s in steps) == gen.stats.n_rounds


def test_eos_inside_an_accepted_run_stops_there(period_is_eos):
    # the target as its own draft accepts whole drafts, so EOS arrives inside an accepted run
    settings = ModelSettings(str(period_is_eos), n_ctx=512, n_ubatch=1)
    with Engine(settings, settings) as same:
        prompt = "Once upon a time"
        ref = same.generate(prompt, spec=SpecSettings(mode="target"), sampling=GREEDY, max_tokens=200).run()
        assert ref.finish_reason == "stop" and ref.text and "." not in ref.text
        for k in (4, 15):
            gen = same.generate(prompt, spec=SpecSettings(mode="spd", k=k), sampling=GREEDY, max_tokens=200).run()
            assert gen.tokens == ref.tokens and gen.finish_reason == "stop"
            assert gen.stats.n_rounds < len(gen.tokens)  # several tokens per round: EOS came mid-run


@pytest.mark.parametrize("mode", ["target", "spd", "fly"])
def test_stop_string_truncates_and_stops(pair, mode):
    full = pair.generate("Once upon a time", spec=SpecSettings(mode=mode), sampling=GREEDY, max_tokens=120).run().text
    word = "Lily" if "Lily" in full else full.split()[5]
    cut = full.index(word)
    gen = pair.generate("Once upon a time", spec=SpecSettings(mode=mode), sampling=GREEDY, max_tokens=120,
                        stop=[word])
    pieces = [s.text for s in gen]
    assert gen.text == full[:cut] and "".join(pieces) == gen.text
    assert gen.finish_reason == "stop"


def test_context_full_stops_cleanly(stories, stories_draft):
    with Engine(ModelSettings(str(stories), n_ctx=64), ModelSettings(str(stories_draft))) as e:
        for mode in ("target", "spd", "fly"):
            gen = e.generate("Once upon a time", spec=SpecSettings(mode=mode), sampling=GREEDY, max_tokens=500).run()
            assert gen.context_full and gen.finish_reason == "length"
            # llama.cpp may round n_ctx up; the text ends where it fills the context (the cache
            # then holds n_ctx - 1 tokens: the last one is never decoded), as llama-server's does
            assert len(e.tokenize("Once upon a time")) + len(gen.tokens) == e.n_ctx
        with pytest.raises(FlyError, match="longer than the context"):
            e.generate("Once upon a time " * 100)


def test_rollback_then_regenerate_equals_fresh(stories, stories_draft):
    settings = ModelSettings(str(stories), n_ctx=512, n_ubatch=1), ModelSettings(str(stories_draft))
    with Engine(*settings) as used, Engine(*settings) as fresh:
        for prompt in ("Once upon a time", "Tom had a big dog", "Once upon a time there"):
            # leave history in both caches
            used.generate("The cat sat on the mat and", sampling=GREEDY, max_tokens=50).run()
            used.target.truncate(3)  # roll the caches back by hand, too
            a = used.generate(prompt, spec=SpecSettings(mode="fly"), sampling=GREEDY, max_tokens=60).run()
            b = fresh.generate(prompt, spec=SpecSettings(mode="fly"), sampling=GREEDY, max_tokens=60).run()
            fresh.target.truncate(0)
            fresh.draft_ctx.truncate(0)
            assert a.tokens == b.tokens and a.stats.n_loose == b.stats.n_loose


def test_abandoned_generation_leaves_caches_consistent(pair):
    fly = SpecSettings(mode="fly")
    ref = pair.generate("Tom had a big dog", spec=fly, sampling=GREEDY, max_tokens=60).run().tokens
    gen = pair.generate("Tom had a big dog", spec=fly, sampling=GREEDY, max_tokens=60)
    for i, _ in enumerate(gen):
        if i == 10:
            gen.close()
            break
    assert pair.generate("Tom had a big dog", spec=fly, sampling=GREEDY, max_tokens=60).run().tokens == ref


def test_seeded_sampling_is_reproducible(pair):
    for mode in ("target", "spd", "fly"):
        runs = [pair.generate("Once upon a time", spec=SpecSettings(mode=mode, k=15), max_tokens=40,
                              sampling=SamplingSettings(temperature=0.8, seed=s)).run().tokens for s in (7, 7, 8)]
        assert runs[0] == runs[1] and runs[0] != runs[2], mode


def test_repeat_penalty_applies_in_every_mode(pair):
    plain = pair.generate("Once upon a time", spec=SpecSettings(mode="target"), sampling=GREEDY,
                          max_tokens=60).run().tokens
    sampling = SamplingSettings(temperature=0, repeat_penalty=1.5)
    target = pair.generate("Once upon a time", spec=SpecSettings(mode="target"), sampling=sampling, max_tokens=60).run()
    spd = pair.generate("Once upon a time", spec=SpecSettings(mode="spd"), sampling=sampling, max_tokens=60).run()
    assert target.tokens != plain and spd.tokens == target.tokens

"""Under ``draw="llama"`` a seed writes the text llama-server writes with it: the target's draw at the n-th generated
token takes the n-th number of llama.cpp's Mersenne Twister (``fly_cpp.backend.sampling``), target-only
or speculative, whatever the drafts."""

from __future__ import annotations

import numpy as np
import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend.sampling import LlamaUniforms, Sampler


def test_the_uniforms_are_the_cpp_engines():
    # std::mt19937 seeded 42 starts 1608637542, 3421126067; a double takes the low word first
    assert LlamaUniforms(42)[0] == (1608637542 + 3421126067 * 2.0**32) / 2.0**64
    # the C++ standard's check: the 10000th output of the default-seeded (5489) engine
    assert int(LlamaUniforms(5489)[4999] * 2.0**32) == 4123659995
    u = LlamaUniforms(3)
    assert [u[i] for i in range(5)] == [LlamaUniforms(3)[i] for i in range(5)]  # the same seed: the same numbers


def test_a_draw_walks_the_chain_most_likely_first():
    sampler = Sampler(SamplingSettings(temperature=1.0, draw="llama"), seed=42, start=10)
    ids, probs = np.array([7, 3, 9]), np.array([0.5, 0.3, 0.2])
    u = sampler.uniforms[0]  # about 0.797: inside the second token's share (0.5 to 0.8)
    assert sampler.draw(ids, probs, 10) == ids[int(np.searchsorted(np.cumsum(probs), u))] == 3
    assert sampler.draw(ids, probs, 10) == Sampler(SamplingSettings(temperature=1.0, draw="llama"), 42, start=3).draw(ids, probs, 3)


@pytest.fixture(scope="module")
def pair(stories, stories_draft):
    with Engine(ModelSettings(str(stories), n_ctx=512, n_batch=32, n_threads=1),
                ModelSettings(str(stories_draft), n_threads=1)) as e:
        yield e


# llama-server's own suite (tools/server/tests, test_completion.py) at --temp 0.8 --seed 42
@pytest.mark.parametrize("spec", [SpecSettings(mode="target"), SpecSettings(), SpecSettings(mode="spd", k=3),
                                  SpecSettings(mode="spd", k=12)])
def test_the_suites_seed_writes_llama_servers_text(pair, spec):
    sampling = SamplingSettings(temperature=0.8, seed=42, draw="llama")
    gen = pair.generate("I believe the meaning of life is", spec=spec, sampling=sampling, max_tokens=8).run()
    assert gen.text == " going to bed. I"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_default_mode_writes_the_same_text_at_any_batch_size(stories, stories_draft, temperature):
    # llama-server's suite: the same request twice, and at batch sizes 16 and 32, write one text
    sampling = SamplingSettings(temperature=temperature, seed=42, draw="llama")
    texts = []
    for n_batch in (16, 32):
        with Engine(ModelSettings(str(stories), n_ctx=256, n_batch=n_batch, n_threads=1),
                    ModelSettings(str(stories_draft), n_ctx=256, n_batch=n_batch, n_threads=1)) as e:
            for _ in range(2):
                texts.append(e.generate("I believe the meaning of life is", sampling=sampling, max_tokens=40).run().text)
    assert len(set(texts)) == 1, texts

"""Tree drafting (``SpecSettings.draft_tree``, ``fly_cpp.drafters.tree``): a chain and one branch
verified in one target decode on a forked KV cache (``Context.decode_tree``), on real llama.cpp
contexts of the bundled stories260K pair. The tree's rows are the rows the chain and the branch
get decoded apart; the branch leaves the cache as a chain's rejected tokens do; the text is
the target's own, greedy and sampled, to the bit under one-row micro-batches."""

from __future__ import annotations

import numpy as np
import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.backend.sampling import Sampler
from fly_cpp.basics.errors import FlyError
from fly_cpp.models import bundled

PROMPTS = ("Once upon a time", "One day, Lily went to the park", "Tom had a big red ball")


@pytest.fixture(scope="module")
def model():
    m = Model(str(bundled.TARGET))
    yield m
    m.close()


def test_a_trees_rows_are_its_paths_rows_and_its_branch_leaves_nothing(model: Model) -> None:
    prompt, chain, branch, fork = [1, 400, 300, 200, 100, 50], [11, 12, 13, 14, 15], [21, 22, 23], 3
    with Context(model, n_ctx=256, n_threads=1, n_ubatch=1, branches=True) as tree, \
            Context(model, n_ctx=256, n_threads=1, n_ubatch=1) as plain:
        assert tree.branches and tree.n_seq == 1 and tree.runs_natively == plain.runs_natively
        for keep in (len(prompt) - 1 + fork, len(prompt) - 1 + 4):  # the text before the fork; into the chain past it
            tree.truncate(0)
            tree.decode(prompt[:-3], logits="none")
            # a catch-up of two tokens first (rows only from the last committed on), as after a branch taken
            rows = np.array(tree.decode_tree([*prompt[-3:], *chain], 2 + fork, branch, 1 + len(chain)))
            plain.truncate(0)
            plain.decode(prompt[:-1], logits="none")
            want_chain = np.array(plain.decode([prompt[-1], *chain], logits="all"))
            plain.truncate(len(prompt) - 1)
            path = [prompt[-1], *chain][:fork] + branch
            want_branch = np.array(plain.decode(path, logits="all"))
            # one-row micro-batches: the same rows (to the bit here, where attention skips the masked cells)
            assert np.allclose(rows[: 1 + len(chain)], want_chain, atol=1e-4)
            assert np.allclose(rows[1 + len(chain):], want_branch[fork:], atol=1e-4)
            tree.truncate(keep)  # drops the branch: its cells lie after the chain's, freed in order
            plain.truncate(0)
            plain.decode([*prompt, *chain][:keep], logits="none")
            assert tree.tokens == plain.tokens
            got, want = np.array(tree.decode([99, 98], logits="all")), np.array(plain.decode([99, 98], logits="all"))
            assert np.array_equal(got, want)  # the cells in their positions' order: exact
        with pytest.raises(ValueError, match="no tree"):
            tree.decode_tree([1, 2, 3], 1, [4], 1)  # rows from past the fork
    with Context(model, n_ctx=256, n_threads=1) as plain, pytest.raises(ValueError, match="no tree"):
        plain.decode_tree([1, 2, 3], 1, [4], 3)
    # without flash attention llama.cpp's attention mixes the sequences of a forked cache: no branches there
    with Context(model, n_ctx=256, n_threads=1, flash_attn="off", branches=True) as off:
        assert not off.branches


def test_the_samplers_ranking_starts_with_its_draw(model: Model) -> None:
    rng = np.random.default_rng(0)
    for temperature, draw in ((0.8, "shared"), (1.5, "shared"), (0.8, "llama")):
        sampler = Sampler(SamplingSettings(temperature=temperature, seed=5, draw=draw), 5)
        for i in range(40):
            row = rng.normal(size=model.n_vocab).astype(np.float32) * 3
            history = list(range(i))
            first, second, gap = sampler.ranked(row, history)
            assert first == sampler.sample(row, history) and second != first and gap >= 0


@pytest.fixture(scope="module")
def engine():
    settings = {"n_ctx": 512, "n_ubatch": 1}  # verification exact: a batch's rows as one-row decodes
    with Engine(ModelSettings(str(bundled.TARGET), **settings), ModelSettings(str(bundled.DRAFT), **settings),
                branches=True) as e:
        yield e


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_trees_text_is_the_targets_own(engine: Engine, temperature: float) -> None:
    branched = tokens = passes = chain_passes = 0
    for seed, text in enumerate(PROMPTS):
        prompt = engine.target_model.tokenize(text)
        sampling = SamplingSettings(temperature=temperature, seed=seed)
        want = engine.generate(prompt, spec=SpecSettings(mode="target"), sampling=sampling, max_tokens=96).run()
        chain = engine.generate(prompt, spec=SpecSettings(mode="spd", k=8, ngram=False), sampling=sampling,
                                max_tokens=96).run()
        got = engine.generate(prompt, spec=SpecSettings(mode="spd", k=8, ngram=False, draft_tree=3),
                              sampling=sampling, max_tokens=96).run()
        assert got.tokens == want.tokens == chain.tokens, text
        s = got.stats
        assert s.n_rounds == sum(s.draft_lengths.values()) and sum(s.accepted_lengths) == s.n_tokens + s.n_eog
        assert max(s.draft_lengths) <= 8  # a tree of k tokens: its chain and its branch together
        branched, tokens, passes = branched + s.n_branched, tokens + s.n_tokens, passes + s.n_passes
        chain_passes += chain.stats.n_passes
    assert branched > 0  # the branch was the target's path at least once
    assert tokens / passes > 2


def test_trees_are_refused_where_they_cannot_run(engine: Engine) -> None:
    for bad, why in ((dict(draft_tree=3), "fixed k"), (dict(mode="spd", k=4, draft_tree=3), "k >= 5"),
                     (dict(mode="fly", k=8, draft_tree=3), "exact verification"),
                     (dict(mode="spd", k=8, draft_tree=-1), "draft_tree")):
        with pytest.raises(FlyError, match=why):
            SpecSettings(**bad)
    prompt = engine.target_model.tokenize(PROMPTS[0])
    with Engine(ModelSettings(str(bundled.TARGET), n_ctx=256), ModelSettings(str(bundled.DRAFT), n_ctx=256)) as plain:
        with pytest.raises(FlyError, match="loaded for trees"):
            plain.generate(prompt, spec=SpecSettings(mode="spd", k=8, draft_tree=3), max_tokens=4).run()
    # the target alone drafts nothing: no tree to verify, nothing refused
    assert engine.generate(prompt, spec=SpecSettings(mode="target", draft_tree=3), max_tokens=4).run().tokens

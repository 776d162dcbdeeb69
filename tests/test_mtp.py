"""Drafting with the target's own MTP head (``fly_cpp.drafters.mtp``), on real llama.cpp contexts over
the kit's synthetic qwen35-mtp (qwen35-tiny's hybrid trunk plus one MTP layer, random weights,
the real Qwen3.5 tokenizer). The head's context is bound to the target's and reads the hidden
states the target records; whatever the head drafts, spd's text is the target's. Checkpoint
runs use ``n_ubatch=1`` (exact rows, docs/fly-rule.md); snapshots need n_ubatch > 9."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.backend.mtp import MtpContext
from fly_cpp.basics.errors import FlyError
from fly_cpp.drafters.drafter import PairDrafter
from fly_cpp.drafters.mtp import MtpHead
from fly_cpp.backend.rollback import CHECKPOINTS, SNAPSHOTS
from fly_cpp.drafters.seam import DraftRules

PROMPTS = ["Hello world, this is a test of the hybrid model.", "def fib(n):\n    return", "The capital of France is"]
WAYS = {SNAPSHOTS: {}, CHECKPOINTS: {"n_ubatch": 1}}
GREEDY = SamplingSettings(temperature=0)


def settings(path, way: str) -> ModelSettings:
    return ModelSettings(str(path), n_ctx=1024, rollback=way, **WAYS[way])


@pytest.fixture(scope="module", params=[SNAPSHOTS, CHECKPOINTS])
def engine(request, qwen35_mtp):
    with Engine(settings(qwen35_mtp, request.param)) as e:
        assert e.mtp_ctx is not None and e.target.rollback == request.param
        yield e


def target_tokens(engine: Engine, prompt: str, n: int = 48, **sampling) -> list[int]:
    """The target's own tokens: greedy unless ``sampling`` says otherwise."""
    return engine.generate(prompt, spec=SpecSettings(mode="target"), max_tokens=n,
                           sampling=SamplingSettings(**{"temperature": 0, **sampling}),
                           cache_prompt=False).run().tokens


def test_the_head_reads_the_targets_states(qwen35_mtp):
    """The head's logits at a position depend on the state it is given, and a catch-up in one
    batch gives the rows that token-by-token decodes give."""
    with Model(qwen35_mtp, mtp=True) as m:
        assert m.n_nextn == 1 and m.mtp_loaded
        target = Context(m, n_ctx=256, n_threads=1, n_batch=64, n_ubatch=64)
        head = MtpContext(target)
        toks = m.tokenize(PROMPTS[0])
        target.decode(toks, logits="none")
        states = np.vstack([np.zeros((1, m.n_embd), np.float32), target.hidden(0, len(toks) - 1)])
        batch, batch_state = head.decode(toks, states)
        head.truncate(0)
        for i, t in enumerate(toks):
            alone, alone_state = head.decode([t], states[i:i + 1])
        assert np.abs(batch - alone).max() < 1e-3
        assert np.abs(batch_state - alone_state).max() < 1e-3  # the last row's state, not the first's
        head.truncate(len(toks) - 1)
        other, _ = head.decode(toks[-1:], np.zeros((1, m.n_embd), np.float32))
        assert np.abs(other - alone).max() > 1e-2
        head.close()
        target.close()


@pytest.mark.parametrize("k", [1, 3, 6])  # k auto: tests/test_mtp_pacing.py
def test_greedy_spd_with_mtp_drafts_is_the_target_token_for_token(engine, k):
    drafted = kept = 0
    for prompt in PROMPTS:
        want = target_tokens(engine, prompt)
        gen = engine.generate(prompt, spec=SpecSettings(mode="spd", k=k, spec_type="draft-mtp", ngram=False),
                              max_tokens=48, sampling=GREEDY)
        got = gen.run()
        assert got.tokens == want
        assert got.stats.drafter == "mtp" and "drafted by the model's MTP head" in got.stats.summary()
        drafted, kept = drafted + got.stats.n_drafted, kept + got.stats.n_exact
    assert drafted > 0 and 0 < kept < drafted  # random weights: some of the head's guesses are the target's


def test_sampled_spd_with_mtp_drafts_is_the_sampled_target(engine):
    sampling = dict(temperature=0.8, seed=7)
    for prompt in PROMPTS[:2]:
        want = target_tokens(engine, prompt, **sampling)
        got = engine.generate(prompt, spec=SpecSettings(mode="spd", k=3, spec_type="mtp"), max_tokens=48,
                              sampling=SamplingSettings(**sampling)).run()
        assert got.tokens == want


def test_fly_with_mtp_drafts_is_reproducible(engine):
    """Greedy: the same request gives the same text."""
    spec = SpecSettings(mode="fly", k=3, entropy_threshold=0.0, loose_min_ratio=0.0)
    first = engine.generate(PROMPTS[1], spec=spec, max_tokens=48, sampling=GREEDY, cache_prompt=False).run()
    again = engine.generate(PROMPTS[1], spec=spec, max_tokens=48, sampling=GREEDY).run()
    assert first.tokens == again.tokens and first.stats.n_drafted > 0


class Altered:
    """The MTP drafter with the drafts of chosen rounds altered: the target rejects them there."""

    def __init__(self, inner: PairDrafter, rounds: set[int]) -> None:
        self.inner, self.rounds, self.round = inner, rounds, 0

    def draft(self, committed, limit):
        self.round += 1
        found = self.inner.draft(committed, limit)
        out = list(found.tokens)
        if self.round in self.rounds and out:
            out[0] += 1
        return out


def test_a_rejection_rolls_the_hybrid_back_and_the_head_follows(engine):
    want = target_tokens(engine, PROMPTS[0], n=40)
    spec = SpecSettings(mode="spd", k=4, ngram=False, spec_type="draft-mtp")
    mark = dataclasses.replace(engine.target.rollbacks)
    drafter = PairDrafter(MtpHead(engine.mtp_ctx), DraftRules.of(spec))
    got = engine.generate(PROMPTS[0], spec=spec, max_tokens=40, sampling=GREEDY,
                          drafter=Altered(drafter, {2, 3, 5})).run()
    assert got.tokens == want
    spent = engine.target.rollbacks.since(mark)
    assert (spent.native if engine.target.rollback == SNAPSHOTS else spent.restores) >= 2
    # the head's cache pairs only committed tokens with the target's states after it
    committed = [*engine.tokenize(PROMPTS[0]), *got.tokens]
    assert engine.mtp_ctx.tokens[: engine.mtp_ctx.exact] == committed[: engine.mtp_ctx.exact]


def test_multi_turn_reuses_both_caches(engine):
    """A second turn that extends the first decodes only what is new, in the target and in the
    head alike, and is still the target's text."""
    spec = SpecSettings(mode="spd", k=3, spec_type="draft-mtp", ngram=False)
    first = engine.generate(PROMPTS[2], spec=spec, max_tokens=24, sampling=GREEDY).run()
    turn2 = engine.tokenize(PROMPTS[2]) + first.tokens + engine.tokenize(" And then", add_special=False)
    exact = engine.mtp_ctx.exact
    steps = PairDrafter(MtpHead(engine.mtp_ctx), DraftRules.of(spec))
    got = engine.generate(turn2, spec=spec, max_tokens=24, sampling=GREEDY, drafter=steps).run()
    assert got.stats.n_cached >= len(turn2) - 8
    assert exact > len(engine.tokenize(PROMPTS[2]))  # the head kept the first turn
    want = engine.generate(turn2, spec=SpecSettings(mode="target"), max_tokens=24, sampling=GREEDY,
                           cache_prompt=False).run()
    assert got.tokens == want.tokens


def test_draft_mtp_on_a_model_without_an_mtp_head_is_one_line(qwen35_pair):
    target, _ = qwen35_pair
    # rollback said (not auto): a measured pick would be cached for the shared qwen35-tiny file
    with Engine(settings(target, CHECKPOINTS)) as e:
        assert e.mtp_ctx is None
        with pytest.raises(FlyError, match="has no MTP layers") as err:
            e.generate("Hello", spec=SpecSettings(mode="spd", spec_type="draft-mtp"), max_tokens=4)
        assert "\n" not in str(err.value)
        assert e.generate("Hello", spec=SpecSettings(mode="spd", k=2), max_tokens=4).run().stats.drafter == ""


def test_spec_type_is_checked():
    with pytest.raises(FlyError, match="spec_type must be one of"):
        SpecSettings(spec_type="eagle3")
    assert SpecSettings(spec_type="mtp").spec_type == "draft-mtp"


def test_generate_on_an_mtp_model_drafts_with_its_head_and_says_so(qwen35_mtp, qwen35_pair):
    """``fly-cpp generate -m MTPMODEL.gguf`` with no -d drafts with the head (the stats line says
    so); ``--spec-type draft-mtp`` on a model without MTP layers is one line of error."""
    from test_cli_generate import fly, one_line_error

    run = fly("generate", "-m", str(qwen35_mtp), "-p", PROMPTS[1], "-n", "24", "--temp", "0", "--mode", "spd",
              "--draft-max", "3", "-c", "512", "--rollback", "checkpoints")
    assert run.returncode == 0, run.stderr
    assert "drafted by the model's MTP head" in run.stderr
    target, _ = qwen35_pair
    line = one_line_error(fly("generate", "-m", str(target), "-p", "Hi", "-n", "4", "--spec-type", "draft-mtp",
                              "-c", "512", "--rollback", "checkpoints"))  # not auto: its pick would be cached
    assert "has no MTP layers" in line


def test_the_server_takes_spec_type_per_request(qwen35_mtp):
    """``spec_type`` ("mtp" or "draft-mtp") is a request field; the text is the target's."""
    from fastapi.testclient import TestClient

    from fly_cpp import Fly
    from fly_cpp.server import create_app

    with Fly(qwen35_mtp, n_ctx=512, n_ubatch=1) as llm, TestClient(create_app(llm)) as client:
        body = {"prompt": PROMPTS[1], "n_predict": 16, "temperature": 0}
        want = client.post("/completion", json={**body, "mode": "target"}).json()["content"]
        r = client.post("/completion", json={**body, "mode": "spd", "spec_type": "mtp", "n_draft": 3})
        assert r.status_code == 200, r.text
        assert r.json()["content"] == want
        bad = client.post("/completion", json={**body, "spec_type": "eagle3"})
        assert 400 <= bad.status_code < 500 and "spec_type" in bad.text

"""Speculation on hybrid models (Gated DeltaNet + attention, as Qwen3.5/3.6), on real llama.cpp
contexts over the synthetic qwen35-tiny pair (random weights, the real Qwen3.5 tokenizer).

A hybrid's recurrent state cannot drop its last tokens by itself: the context rolls it back
with llama.cpp's snapshots (``n_rs_seq``) or with checkpoints of the state, restored and the
kept tokens decoded again (``fly_cpp.backend.rollback``). Whatever the way, the equivalences of the
transformer pairs hold here too. Checkpoint runs use ``n_ubatch=1`` (every row computed as a
one-token decode: exact); snapshots need a micro-batch that holds them (n_ubatch > 9), and this
model's rows come out of a batch as they do alone, so those runs are exact too.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.basics.errors import FlyError
from fly_cpp.backend.rollback import CHECKPOINTS, KV, NONE, SNAPSHOTS

PROMPTS = ["Hello world, this is a test of the hybrid model.", "def fib(n):\n    return", "The capital of France is"]
WAYS = {SNAPSHOTS: {}, CHECKPOINTS: {"n_ubatch": 1}}
GREEDY = SamplingSettings(temperature=0)


def settings(path, way: str, **extra) -> ModelSettings:
    return ModelSettings(str(path), n_ctx=1024, rollback=way, **{**WAYS[way], **extra})


@pytest.fixture(scope="module", params=[SNAPSHOTS, CHECKPOINTS])
def pair(request, qwen35_pair):
    target, draft = qwen35_pair
    with Engine(settings(target, request.param), settings(draft, request.param)) as e:
        assert e.target.rollback == e.draft_ctx.rollback == request.param
        yield e


def target_tokens(engine: Engine, prompt: str, n: int = 48, **sampling) -> list[int]:
    """The target's own tokens: greedy unless ``sampling`` says otherwise."""
    return engine.generate(prompt, spec=SpecSettings(mode="target"), max_tokens=n,
                           sampling=SamplingSettings(**{"temperature": 0, **sampling}),
                           cache_prompt=False).run().tokens


# -- the context's rollback -------------------------------------------------------------------

def test_checkpoints_keep_a_ring_of_rounds_and_the_ends_of_prompts():
    from fly_cpp.backend.rollback import PINNED, RING, Checkpoint, Checkpoints

    cps = Checkpoints()
    cps.add(Checkpoint(10, "prompt", pinned=True))
    for pos in range(20, 20 + RING + 2):
        cps.add(Checkpoint(pos, f"round {pos}"))
    assert [c.pos for c in cps.items] == [10, *range(22, 22 + RING)]  # the oldest rounds went, the prompt stayed
    assert cps.best(21).pos == 10 and cps.best(23).pos == 23 and cps.best(9) is None
    assert cps.spare() == "round 22" and cps.at(22) is None  # the buffer the next round's copy reuses
    cps.drop_after(22)
    assert [c.pos for c in cps.items] == [10]
    for pos in range(PINNED + 1):
        cps.add(Checkpoint(pos, "p", pinned=True))
    assert len(cps.items) == PINNED



def test_the_way_back_is_chosen_per_model(qwen35_pair, qwen35_transformer):
    target, _ = qwen35_pair
    with Model(target) as m, Model(qwen35_transformer) as t:
        assert m.recurrent and not t.recurrent
        with Context(m, n_ctx=256, n_threads=1) as ctx:
            assert ctx.rollback == SNAPSHOTS and ctx.n_rs_seq > 0 and ctx.can_rollback
        with Context(m, n_ctx=256, n_threads=1, n_ubatch=1) as ctx:  # a micro-batch too small for snapshots
            assert ctx.rollback == CHECKPOINTS and ctx.n_rs_seq == 0
        with Context(m, n_ctx=256, n_threads=1, rollback=CHECKPOINTS) as ctx:
            assert ctx.rollback == CHECKPOINTS
        with pytest.raises(FlyError, match="snapshots needs n_ubatch"):
            Context(m, n_ctx=256, n_threads=1, n_ubatch=1, rollback=SNAPSHOTS)
        with Context(t, n_ctx=256, n_threads=1, rollback=SNAPSHOTS) as ctx:
            assert ctx.rollback == KV


def _reference(model: Model, tokens: list[int]) -> np.ndarray:
    with Context(model, n_ctx=512, n_threads=1, rollback=CHECKPOINTS) as ctx:
        if len(tokens) > 1:
            ctx.decode(tokens[:-1], logits="none")
        return ctx.decode(tokens[-1:])[0].copy()


@pytest.mark.parametrize("way", [SNAPSHOTS, CHECKPOINTS])
def test_rollbacks_then_decodes_give_the_logits_of_a_fresh_decode(qwen35_pair, way):
    """Random decodes (rows checked, as verification does), rollbacks and checkpoints: every
    decode's last row is what a fresh context decoding the same tokens gives. (llama.cpp's
    kernels differ by a few hundredths between batch shapes; a wrong state is off by whole
    units: a snapshot rollback past the decode's first token gave 4.9.)"""
    target, _ = qwen35_pair
    rng = random.Random(7)
    with Model(target) as m, Context(m, n_ctx=512, n_threads=1, rollback=way) as ctx:
        for _ in range(70):
            op = rng.random()
            if op < 0.5 or len(ctx.tokens) < 3:
                new = [rng.randrange(5000) for _ in range(rng.randint(1, 10))]
                last = ctx.decode(new, logits=rng.choice(["all", "last", len(new)]))[-1].copy()
                assert np.abs(last - _reference(m, ctx.tokens)).max() < 0.5
            elif op < 0.8:
                ctx.truncate(len(ctx.tokens) - rng.randint(1, min(12, len(ctx.tokens))))
            else:
                ctx.checkpoint(max(0, len(ctx.tokens) - rng.randint(0, 5)))
        costs = ctx.rollbacks
        assert costs.copies and costs.restores and costs.redecoded
        assert (costs.native > 0) == (way == SNAPSHOTS)


def test_snapshots_never_drop_the_state_before_a_decode(qwen35_pair):
    """llama.cpp's snapshots hold the states inside the last decode: after a one-token decode,
    dropping that token natively would read a stale state. The context restores instead."""
    target, _ = qwen35_pair
    with Model(target) as m, Context(m, n_ctx=256, n_threads=1) as ctx:
        toks = m.tokenize("one two three four five six seven")
        ctx.decode(toks[:-1], logits="none")
        ctx.decode(toks[-1:])
        native = ctx.rollbacks.native
        ctx.truncate(len(toks) - 1)
        assert ctx.rollbacks.native == native and ctx.tokens == toks[:-1]
        again = ctx.decode(toks[-1:])[0]
        assert np.abs(again - _reference(m, toks)).max() < 0.5


# -- speculation on the pair -------------------------------------------------------------------

@pytest.mark.parametrize("k", [3, 8, "auto"])
def test_greedy_spd_is_the_target_token_for_token(pair, k):
    for prompt in PROMPTS:
        want = target_tokens(pair, prompt)
        got = pair.generate(prompt, spec=SpecSettings(mode="spd", k=k), max_tokens=48, sampling=GREEDY).run()
        assert got.tokens == want
    assert got.stats.n_drafted > 0 or k == "auto"


class Scripted:
    """A real drafter whose drafts are altered at chosen (round, position) pairs."""

    def __init__(self, inner, edits):
        self.inner, self.edits, self.round = inner, dict(edits), 0

    def draft(self, committed, limit):
        self.round += 1
        out = list(self.inner.draft(committed, limit).tokens)
        for (r, i), token in self.edits.items():
            if r == self.round and i < len(out):
                out[i] = token(out[i])
        return out


def other(token: int) -> int:
    return token + 1


@pytest.fixture(scope="module", params=[SNAPSHOTS, CHECKPOINTS])
def self_pair(request, qwen35_pair):
    """The hybrid target drafting for itself: every drafted token is kept unless a script alters it."""
    target, _ = qwen35_pair
    s = settings(target, request.param)
    with Engine(s, s) as e:
        yield e


def test_a_full_accept_keeps_every_drafted_token(self_pair):
    want = target_tokens(self_pair, PROMPTS[0], n=40)
    got = self_pair.generate(PROMPTS[0], spec=SpecSettings(mode="spd", k=4, ngram=False), max_tokens=40,
                             sampling=GREEDY).run()
    assert got.tokens == want
    assert got.stats.n_drafted == got.stats.n_exact and got.stats.mean_accepted == pytest.approx(5.0, abs=0.3)


def test_a_rejection_mid_draft_rolls_back_to_the_target_text(self_pair):
    want = target_tokens(self_pair, PROMPTS[0], n=40)
    spec = SpecSettings(mode="spd", k=6, ngram=False)
    mark = dataclasses.replace(self_pair.target.rollbacks)
    gen = self_pair.generate(PROMPTS[0], spec=spec, max_tokens=40, sampling=GREEDY,
                             drafter=Scripted(self_pair.drafter(spec), {(1, 2): other, (3, 4): other, (4, 0): other}))
    got = gen.run()
    assert got.tokens == want
    assert got.stats.n_drafted - got.stats.n_exact >= 2  # the altered tokens were drafted and rejected
    spent = self_pair.target.rollbacks.since(mark)
    assert (spent.native if self_pair.target.rollback == SNAPSHOTS else spent.restores) >= 2


def test_the_cross_round_window_refutes_through_a_rollback(self_pair):
    """Round 2 keeps an altered tail token provisionally (the window needs more matches); round
    3's first drafted token is altered too, which refutes it: the target cache goes back past
    round 3's own decode to the mismatch, and the text is the in-round rule's."""
    want = target_tokens(self_pair, PROMPTS[0], n=40)
    spec = SpecSettings(mode="fly", k=8, window=6, entropy_threshold=0.0, cross_round=True,
                        cross_round_confidence=0, fly_rule="paper", ngram=False)
    gen = self_pair.generate(PROMPTS[0], spec=spec, max_tokens=40, sampling=GREEDY,
                             drafter=Scripted(self_pair.drafter(spec), {(2, 7): other, (3, 0): other}))
    got = gen.run()
    assert (got.stats.n_provisional, got.stats.n_refuted) == (1, 1)
    assert got.tokens == want
    # the caches are right after it: the next generation is the target's text again
    again = self_pair.generate(PROMPTS[1], spec=SpecSettings(mode="spd", k=5), max_tokens=40, sampling=GREEDY).run()
    assert again.tokens == target_tokens(self_pair, PROMPTS[1], n=40)


def test_sampled_spd_is_the_sampled_target_for_a_seed(pair):
    sampling = {"temperature": 0.9, "seed": 11}
    for prompt in PROMPTS[:2]:
        want = target_tokens(pair, prompt, **sampling)
        got = pair.generate(prompt, spec=SpecSettings(mode="spd", k=4), max_tokens=48,
                            sampling=SamplingSettings(**sampling)).run()
        assert got.tokens == want


def test_a_multi_turn_chat_reuses_the_prompt_cache(pair):
    """Each turn's prompt extends the last one (its answer included): the caches keep what they
    share, and every answer is the one a fresh engine gives."""
    conversation = PROMPTS[0]
    spec = SpecSettings(mode="spd", k=4)
    for turn in range(3):
        gen = pair.generate(conversation, spec=spec, max_tokens=24, sampling=GREEDY)
        answer = gen.run()
        if turn:
            assert answer.stats.n_cached > len(pair.tokenize(PROMPTS[0]))
        assert answer.tokens == target_tokens(pair, conversation, n=24)
        conversation += answer.text + f" And then, turn {turn + 2}:"


def test_fly_mode_runs_with_its_defaults(pair):
    gen = pair.generate(PROMPTS[2], max_tokens=48).run()
    assert gen.stats.n_tokens == 48 and gen.stats.rollback is not None


# -- pairs across kinds --------------------------------------------------------------------------

@pytest.mark.parametrize("hybrid_role", ["target", "draft"])
def test_a_hybrid_pairs_with_a_transformer_either_way(qwen35_pair, qwen35_transformer, hybrid_role):
    hybrid_target, hybrid_draft = qwen35_pair
    if hybrid_role == "target":
        target, draft = settings(hybrid_target, CHECKPOINTS), ModelSettings(str(qwen35_transformer), n_ctx=1024)
    else:
        target, draft = ModelSettings(str(qwen35_transformer), n_ctx=1024, n_ubatch=1), settings(hybrid_draft, SNAPSHOTS)
    with Engine(target, draft) as e:
        for prompt in PROMPTS[:2]:
            want = target_tokens(e, prompt, n=32)
            got = e.generate(prompt, spec=SpecSettings(mode="spd", k=4), max_tokens=32, sampling=GREEDY).run()
            assert got.tokens == want and got.stats.n_drafted > 0


def test_a_state_that_cannot_go_back_is_refused_in_one_line(qwen35_pair, monkeypatch):
    target, draft = qwen35_pair
    monkeypatch.setattr(Context, "_rollback_kind", lambda self, recurrent: NONE if recurrent else KV)
    # a state that cannot go back has no way to pick: whatever an earlier test cached is not asked
    monkeypatch.setattr("fly_cpp.engine.loading.pick_rollback", lambda model, settings, threads: "auto")
    with pytest.raises(FlyError, match="can neither roll back nor checkpoint") as e:
        Engine(ModelSettings(str(target), n_ctx=256), ModelSettings(str(draft), n_ctx=256))
    assert "\n" not in str(e.value)
    with Engine(ModelSettings(str(target), n_ctx=256)) as alone:  # the target alone still runs
        assert alone.generate("Hello", spec=SpecSettings(mode="target"), max_tokens=4).run().stats.n_tokens == 4
        with pytest.raises(FlyError, match="can neither roll back"):
            alone.generate("Hello", spec=SpecSettings(mode="spd"), max_tokens=4)


# -- what k auto knows about rollbacks ---------------------------------------------------------

def test_k_auto_prices_a_rejection_on_a_recurrent_state():
    from fly_cpp.kauto.costs import Costs, Curve
    from fly_cpp.kauto.pacer import Pacer
    from fly_cpp.backend.rollback import Ledger
    from fly_cpp.kauto.rollback_costs import Rollbacks

    ms = 1e-3
    ledger = Ledger(copies=1, copy_seconds=1 * ms, restores=1, restore_seconds=2 * ms)
    target, draft = Curve((1, 2, 8), (10 * ms, 11 * ms, 14 * ms)), Curve((1, 8), (1 * ms, 2 * ms))
    kv = Costs(target, draft)
    checkpoints = Costs(target, draft, rollbacks=Rollbacks(CHECKPOINTS, 0, ledger, KV, None))
    snapshots = Costs(target, draft, rollbacks=Rollbacks(SNAPSHOTS, 8, ledger, KV, None))
    assert kv.rollback(4, 0.5) == 0.0
    assert checkpoints.rollback(4, 1.0) == pytest.approx(1 * ms)  # all kept: only the copy before the decode
    assert checkpoints.rollback(4, 0.0) == pytest.approx(1 * ms + 2 * ms + 10 * ms)  # none kept: restore, decode 1 row
    assert snapshots.rollback(4, 0.3) == 0.0 and snapshots.rollback(10, 0.0) > 0  # past the snapshots: checkpoints
    # the dearer a rejection, the shorter the best draft
    h = {name: Pacer(lambda c=c: c, 16).best(0.8, 16, 1 * ms, 1 * ms)[1]
         for name, c in (("kv", kv), ("checkpoints", checkpoints))}
    assert 0 < h["checkpoints"] < h["kv"]


def test_the_cheaper_way_is_measured_once_per_model(qwen35_pair, tmp_path, monkeypatch):
    from fly_cpp.kauto import rollback_costs as costs

    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    target, _ = qwen35_pair
    calls = []
    real = costs.measure_rollbacks
    monkeypatch.setattr(costs, "measure_rollbacks", lambda *a, **k: calls.append(1) or real(*a, **k))
    with Model(target) as m:
        s = ModelSettings(str(target))
        way = costs.pick_rollback(m, s, 1)
        assert way in (SNAPSHOTS, CHECKPOINTS) and costs.pick_rollback(m, s, 1) == way and len(calls) == 1
        assert costs.pick_rollback(m, ModelSettings(str(target), rollback=CHECKPOINTS), 1) == CHECKPOINTS
        ways = real(m, 1, rounds=2)
        assert [w.way for w in ways] == [SNAPSHOTS, CHECKPOINTS] and all(w.round_ms > 0 for w in ways)
        assert [w.way for w in real(m, 1, rounds=2, n_ubatch=1)] == [CHECKPOINTS]


def test_the_server_answers_on_a_hybrid_pair(qwen35_pair, tmp_path):
    """``fly-cpp serve`` on the hybrid pair, asked as llama-server and as the OpenAI API: the
    greedy answer is the target's own, and a second request reuses the prompt cache."""
    import httpx
    from serving import Server

    target, draft = qwen35_pair
    server = Server(tmp_path, "-m", str(target), "-d", str(draft), "-t", "1", "-c", "1024", "--mode", "spd")
    try:
        with Engine(ModelSettings(str(target), n_ctx=1024)) as alone:
            want = alone.detokenize(target_tokens(alone, PROMPTS[0], n=24))
        for _ in range(2):
            r = httpx.post(server.url + "/completion", json={"prompt": PROMPTS[0], "n_predict": 24, "temperature": 0},
                           timeout=120)
            assert r.status_code == 200 and r.json()["content"] == want
        assert r.json()["timings"]["cache_n"] > 0 and r.json()["fly"]["rollback"]["target"]["way"] in (SNAPSHOTS, CHECKPOINTS)
        r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0},
                       timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
    finally:
        assert server.stop() == 0

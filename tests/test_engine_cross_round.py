"""The cross-round deferred window on real llama.cpp contexts: holding, confirming, refuting,
and rolling both caches back (the rule's tables are in test_accept.py)."""

from __future__ import annotations

import math

import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings

GREEDY = SamplingSettings(temperature=0)


class Scripted:
    """A real drafter whose drafts are altered at chosen (round, position) pairs."""

    def __init__(self, inner, edits):
        self.inner, self.edits, self.round = inner, dict(edits), 0

    def draft(self, committed, limit):
        self.round += 1
        out = self.inner.draft(committed, limit).tokens
        for (r, i), token in self.edits.items():
            if r == self.round and i < len(out):
                out[i] = token(out[i]) if callable(token) else token
        return out

    def close(self):
        pass


@pytest.fixture(scope="module")
def self_pair(stories):
    # the target drafts for itself: every draft token matches unless a script alters it
    settings = ModelSettings(str(stories), n_ctx=512, n_ubatch=1)
    with Engine(settings, settings) as e:
        yield e


def scripted_run(engine, monkeypatch, edits, k=4, cross=True, n=40):
    spec = SpecSettings(mode="fly", k=k, window=6, entropy_threshold=0.0, cross_round=cross, cross_round_confidence=0,
                        fly_rule="paper")  # the window's mechanics, not the safeguards
    gen = engine.generate("Once upon a time", spec=spec, sampling=GREEDY, max_tokens=n,
                          drafter=Scripted(engine.drafter(spec), edits))
    steps = list(gen)
    return gen, steps


def other(token):
    return token + 1 if token + 1 < 512 else token - 1


def test_provisional_accept_confirmed_in_the_next_round(self_pair, monkeypatch):
    target = self_pair.generate("Once upon a time", spec=SpecSettings(mode="target"), sampling=GREEDY,
                                max_tokens=40).run().tokens
    gen, steps = scripted_run(self_pair, monkeypatch, {(2, 7): other}, k=8)
    s = gen.stats
    assert (s.n_provisional, s.n_confirmed, s.n_refuted, s.n_loose) == (1, 1, 0, 1)
    # round 1 emits 9 tokens (8 drafted + bonus); round 2's last drafted token was altered and
    # kept pending (5 exact matches to go), which round 3's draft supplies
    assert gen.tokens[:16] == target[:16] and gen.tokens[16] == other(target[16])
    assert [i for i, st in enumerate(steps) if st.loose] == [16]
    assert steps[16].round == 2
    assert "".join(st.text for st in steps) == gen.text


def test_refuted_provisional_falls_back_to_the_in_round_text(self_pair, monkeypatch):
    target = self_pair.generate("Once upon a time", spec=SpecSettings(mode="target"), sampling=GREEDY,
                                max_tokens=40).run().tokens
    # round 2 keeps an altered tail token provisionally; round 3's first drafted token is altered too
    gen, steps = scripted_run(self_pair, monkeypatch, {(2, 7): other, (3, 0): other}, k=8)
    s = gen.stats
    assert (s.n_provisional, s.n_confirmed, s.n_refuted) == (1, 0, 1) and s.n_refuted_rounds == 1
    assert gen.tokens == target  # the in-round rule rejects the altered token and emits the target's
    assert not any(st.loose for st in steps)
    in_round, _ = scripted_run(self_pair, monkeypatch, {(2, 7): other}, k=8, cross=False)
    assert in_round.tokens == target


def test_refutation_rolls_both_caches_back(self_pair, monkeypatch, stories):
    gen, _ = scripted_run(self_pair, monkeypatch, {(2, 3): other, (3, 0): other, (6, 2): other, (7, 1): other}, n=60)
    assert gen.stats.n_refuted >= 1
    cross = SpecSettings(mode="fly", k=4, cross_round=True)
    again = self_pair.generate("Once upon a time", spec=cross, sampling=GREEDY, max_tokens=60).run()
    settings = ModelSettings(str(stories), n_ctx=512, n_ubatch=1)
    with Engine(settings, settings) as fresh:
        ref = fresh.generate("Once upon a time", spec=cross, sampling=GREEDY, max_tokens=60).run()
    assert again.tokens == ref.tokens


@pytest.fixture(scope="module")
def pair(stories, stories_draft):
    with Engine(ModelSettings(str(stories), n_ctx=512, n_ubatch=1), ModelSettings(str(stories_draft))) as e:
        yield e


PROMPTS = ["Once upon a time", "Tom had a big dog", "Lily and Tom went to the park", "The little bird",
           "One day, a girl named Mia", "The cat was hungry"]


@pytest.mark.parametrize("k", [3, 5])
def test_real_runs_stream_nothing_that_is_taken_back(pair, k):
    provisional = 0
    for prompt in PROMPTS:
        gen = pair.generate(prompt, spec=SpecSettings(mode="fly", k=k, cross_round=True), sampling=GREEDY,
                            max_tokens=80, stop=["\n\n"])
        shown = ""
        for step in gen:
            shown += step.text
            assert gen.text == shown  # what was shown is the text so far, never revised
        assert shown == gen.text and pair.detokenize(gen.tokens).startswith(gen.text)
        s = gen.stats
        assert s.n_provisional == s.n_confirmed + s.n_refuted or s.n_provisional == s.n_confirmed + s.n_refuted + 1
        provisional += s.n_provisional
    assert provisional > 0  # the rule did act on these prompts


def test_confidence_limits_provisional_accepts(pair):
    counts = []
    for confidence in (0.0, 0.5, 0.9):
        spec = SpecSettings(mode="fly", k=4, cross_round=True, cross_round_confidence=confidence,
                            fly_rule="paper")
        counts.append(sum(pair.generate(p, spec=spec, sampling=GREEDY, max_tokens=80).run().stats.n_provisional
                          for p in PROMPTS))
    assert counts[0] >= counts[1] >= counts[2] and counts[0] > counts[2]


def test_large_k_gives_the_in_round_decisions_until_a_tail_case(pair):
    for prompt in PROMPTS:
        inround = pair.generate(prompt, spec=SpecSettings(mode="fly", k=15), sampling=GREEDY, max_tokens=60).run()
        cross = pair.generate(prompt, spec=SpecSettings(mode="fly", k=15, cross_round=True), sampling=GREEDY,
                              max_tokens=60).run()
        if cross.stats.n_provisional == 0 and cross.stats.n_loose == inround.stats.n_loose:
            assert cross.tokens == inround.tokens, prompt


def test_cross_round_with_gate_at_infinity_is_spd(pair):
    for prompt in PROMPTS[:3]:
        spec = SpecSettings(mode="fly", k=4, cross_round=True, entropy_threshold=math.inf)
        assert pair.generate(prompt, spec=spec, sampling=GREEDY, max_tokens=50).run().tokens == \
            pair.generate(prompt, spec=SpecSettings(mode="spd", k=4), sampling=GREEDY, max_tokens=50).run().tokens


def test_ngram_only_drafting_refutes_when_no_draft_can_complete_a_window(stories):
    with Engine(ModelSettings(str(stories), n_ctx=512, n_ubatch=1)) as alone:
        spec = SpecSettings(mode="fly", k=4, cross_round=True, cross_round_confidence=0, fly_rule="paper")
        gen = alone.generate("Once upon a time", spec=spec, sampling=GREEDY, max_tokens=120)
        shown = "".join(step.text for step in gen)
        s = gen.stats
        assert shown == gen.text and len(gen.tokens) == 120
        assert s.n_provisional >= s.n_confirmed + s.n_refuted and s.n_refuted > 0

"""Equivalences on real llama.cpp contexts: exact-match speculation is the target's own greedy
output, token for token, whatever the draft and k; FLy with the gate shut is exact matching.

llama.cpp's CPU kernels are not batch-invariant: a row computed in a batch of k+1 can differ
from the same row decoded alone in the last bits, which flips the argmax where the top two
logits are nearly tied. The exact identities therefore run with ``n_ubatch=1`` on the target
(each verified row is computed exactly as a one-token decode); the default batched path is
checked to agree up to such near-ties.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend.context import Context

STORY_PROMPTS = [
    "Once upon a time",
    "Lily and Tom went to the park",
    "The little dog was sad because",
    "One day, a big red ball",
    "Sam liked to eat",
    "There was a girl named Sue. She",
    "The sun was hot and",
    "Mom said,",
]
TEXT_PROMPTS = [
    "The quick brown fox",
    "def fibonacci(n):",
    "Question: what is 12 times 7? Answer:",
    "Paris is the capital of",
    "import numpy as np\n",
    "1, 2, 3, 4,",
]
GREEDY = SamplingSettings(temperature=0)


def greedy(engine: Engine, prompt: str, mode: str, k: int | str = 15, n: int = 48, **spec) -> list[int]:
    return engine.generate(prompt, spec=SpecSettings(mode=mode, k=k, **spec), sampling=GREEDY, max_tokens=n).run().tokens


def exact_target(path) -> ModelSettings:
    return ModelSettings(str(path), n_ctx=512, n_ubatch=1)


@pytest.fixture(scope="module")
def stories_pair(stories, stories_draft):
    with Engine(exact_target(stories), ModelSettings(str(stories_draft))) as e:
        yield e


@pytest.fixture(scope="module", params=["cut2", "q8_0"])
def llama3_pair(request, llama3_target, llama3_drafts):
    with Engine(exact_target(llama3_target), ModelSettings(str(llama3_drafts[request.param]))) as e:
        yield e


@pytest.mark.parametrize("k", [1, 3, 8, 15])
@pytest.mark.parametrize("ngram", [True, False])
def test_spd_equals_target_on_stories(stories_pair, k, ngram):
    for prompt in STORY_PROMPTS:
        expected = greedy(stories_pair, prompt, "target", n=64)
        assert greedy(stories_pair, prompt, "spd", k=k, n=64, ngram=ngram) == expected, prompt


@pytest.mark.parametrize("k", [2, 5, 15])
def test_spd_equals_target_on_llama3_vocab(llama3_pair, k):
    for prompt in TEXT_PROMPTS:
        expected = greedy(llama3_pair, prompt, "target")
        assert greedy(llama3_pair, prompt, "spd", k=k) == expected, prompt


def test_target_as_its_own_draft_accepts_everything(stories):
    with Engine(exact_target(stories), ModelSettings(str(stories))) as e:
        for prompt in STORY_PROMPTS[:4]:
            expected = greedy(e, prompt, "target", n=60)
            gen = e.generate(prompt, spec=SpecSettings(mode="spd", k=5), sampling=GREEDY, max_tokens=60).run()
            assert gen.tokens == expected
            s = gen.stats
            assert s.n_exact == s.n_drafted  # every drafted token accepted
            # the first token comes from the prompt's last row (a round of one); all other rounds are
            # full (k accepted + bonus) except where max_tokens cut the last one
            assert s.accepted_lengths[0] == 1 and s.n_from_prompt == 1 and s.n_passes == s.n_rounds - 1
            assert s.accepted_lengths[1:-1] == [6] * (len(s.accepted_lengths) - 2)


def test_target_as_its_own_draft_on_llama3_vocab(llama3_target):
    with Engine(exact_target(llama3_target), ModelSettings(str(llama3_target))) as e:
        for prompt in TEXT_PROMPTS[:3]:
            gen = e.generate(prompt, spec=SpecSettings(mode="fly", k=7), sampling=GREEDY, max_tokens=40).run()
            assert gen.tokens == greedy(e, prompt, "target", n=40)
            assert gen.stats.n_exact == gen.stats.n_drafted and gen.stats.n_loose == 0
            # the first token comes from the prompt's row where the target is sure there, else a round verifies it
            assert gen.stats.n_passes == gen.stats.n_rounds - gen.stats.n_from_prompt


@pytest.mark.parametrize("rule", ["shut", "paper", "guarded"])
def test_fly_takes_its_first_token_from_the_prompt_row_where_nothing_else_could_be_kept(stories_pair, stories_draft,
                                                                                       rule):
    # the gate just below ln 3 (the top-3 entropy's ceiling) still loosens in principle but never opens
    # on these prompts; at 0 with no plausibility floor any other token could be kept anywhere: the
    # published rule keeps whatever a first draft holds, so its first round verifies the first token;
    # the guarded rule keeps only the draft model's own token, so it asks for it at the prompt's row
    spec = dict(entropy_threshold=1.0986) if rule == "shut" else dict(
        entropy_threshold=0.0, loose_min_ratio=0.0, fly_rule=rule)
    with Engine(ModelSettings(str(stories_draft), n_ctx=512)) as draft_alone:
        for prompt in STORY_PROMPTS:
            gen = stories_pair.generate(prompt, spec=SpecSettings(mode="fly", k=6, loosen="on", **spec),
                                        sampling=GREEDY, max_tokens=24).run()
            s = gen.stats
            if rule == "shut":  # then FLy is exact matching, and so is its text
                assert s.n_from_prompt == 1 and gen.tokens == greedy(stories_pair, prompt, "spd", k=6, n=24), prompt
            elif rule == "paper":
                assert s.n_from_prompt == 0 and s.n_asked == 0, prompt
            else:
                agree = greedy(draft_alone, prompt, "target", n=1) == greedy(stories_pair, prompt, "target", n=1)
                assert s.n_asked >= 1 and s.n_from_prompt == agree, prompt


def test_fly_with_gate_at_infinity_equals_spd(stories_pair, llama3_pair):
    for engine, prompts in ((stories_pair, STORY_PROMPTS), (llama3_pair, TEXT_PROMPTS)):
        for prompt in prompts:
            assert greedy(engine, prompt, "fly", entropy_threshold=math.inf) == greedy(engine, prompt, "spd"), prompt


def test_fly_accepts_at_least_as_much_as_spd(stories_pair):
    fly = spd = 0.0
    loose = 0
    for prompt in STORY_PROMPTS:
        a = stories_pair.generate(prompt, spec=SpecSettings(mode="fly", k=15), sampling=GREEDY, max_tokens=96)
        b = stories_pair.generate(prompt, spec=SpecSettings(mode="spd", k=15), sampling=GREEDY, max_tokens=96)
        a, b = a.run().stats, b.run().stats
        assert b.n_loose == 0 and b.n_exact <= b.n_drafted  # spd keeps exact matches only
        loose += a.n_loose
        fly, spd = fly + a.mean_accepted, spd + b.mean_accepted
    assert loose > 0  # on these prompts FLy keeps some mismatches
    assert fly > spd


def test_spd_output_does_not_depend_on_k_or_drafter(stories, stories_draft):
    """Greedy spd writes the target's own text whatever the draft length and whoever drafts
    (n-gram lookup alone, the draft model with and without n-gram guesses, k auto)."""
    with Engine(exact_target(stories)) as alone, Engine(exact_target(stories), exact_target(stories_draft)) as pair:
        for prompt in STORY_PROMPTS[:4]:
            expected = greedy(alone, prompt, "target", n=64)
            for k in (1, 3, 6, 15):
                assert greedy(alone, prompt, "spd", k=k, n=64) == expected, (prompt, "n-gram", k)
                assert greedy(pair, prompt, "spd", k=k, n=64) == expected, (prompt, "draft model", k)
                assert greedy(pair, prompt, "spd", k=k, n=64, ngram=False) == expected, (prompt, "draft alone", k)
            auto = pair.generate(prompt, spec=SpecSettings(mode="spd"), sampling=GREEDY, max_tokens=64).run().tokens
            assert auto == expected, (prompt, "k auto")


def test_batched_verification_diverges_only_at_near_ties(stories, stories_draft):
    """Default settings (batched verification): spd follows the target until a position where
    the target's top two logits are tied to within float noise, if any."""
    with Engine(ModelSettings(str(stories), n_ctx=512), ModelSettings(str(stories_draft))) as e:
        probe = Context(e.target_model, n_ctx=512, n_threads=1, n_ubatch=1)
        for prompt in STORY_PROMPTS:
            expected = greedy(e, prompt, "target", n=96)
            for k in (3, 15):
                got = greedy(e, prompt, "spd", k=k, n=96)
                if got == expected:
                    continue
                i = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
                probe.truncate(0)
                row = probe.decode(e.tokenize(prompt) + expected[:i], logits="last")[0]
                assert abs(float(row[got[i]]) - float(row[expected[i]])) < 1e-3 * max(1.0, float(np.abs(row).max()))
        probe.close()


@pytest.mark.parametrize("mode", ["spd", "fly"])
def test_k_auto_runs_and_reports_its_draft_lengths(stories_pair, mode):
    gen = stories_pair.generate("Once upon a time", spec=SpecSettings(mode=mode, k="auto"), sampling=GREEDY,
                                max_tokens=64).run()
    s = gen.stats
    assert len(gen.tokens) == 64 and sum(s.draft_lengths.values()) == s.n_rounds
    assert sum(n * r for n, r in s.draft_lengths.items()) == s.n_drafted and max(s.draft_lengths) <= 16
    # not planned: the last round, and the prompt's row (the first token, under exact verification)
    assert s.pacing is not None and s.pacing["costs"]["target_ms"] and sum(s.pacing["plans"].values()) >= s.n_rounds - 2


def test_spd_with_k_auto_is_still_the_target_greedy_and_seeded(stories_pair):
    """Whatever draft lengths the controller picks (they follow live timings), spd writes the
    target's own tokens: greedy, and sampled with the same seed (draws depend on seed and
    position only)."""
    for prompt in STORY_PROMPTS[:4]:
        assert greedy(stories_pair, prompt, "spd", k="auto") == greedy(stories_pair, prompt, "target"), prompt
        sampling = SamplingSettings(temperature=0.9, seed=11)
        target = stories_pair.generate(prompt, spec=SpecSettings(mode="target"), sampling=sampling, max_tokens=48)
        spd = stories_pair.generate(prompt, spec=SpecSettings(mode="spd", k="auto"), sampling=sampling, max_tokens=48)
        fixed = stories_pair.generate(prompt, spec=SpecSettings(mode="spd", k=7), sampling=sampling, max_tokens=48)
        assert spd.run().tokens == target.run().tokens == fixed.run().tokens, prompt


def run_fly(engine: Engine, prompt: str, n: int = 64, **spec):
    gen = engine.generate(prompt, spec=SpecSettings(mode="fly", k=15, **spec), sampling=GREEDY, max_tokens=n)
    loose = [i for i, step in enumerate(gen) if step.loose]
    return gen, loose


def test_guarded_rule_with_no_floor_is_the_paper_rule_when_greedy(stories_pair):
    """Greedy logits are finite, so the support guard alone refuses nothing."""
    for prompt in STORY_PROMPTS:
        paper, _ = run_fly(stories_pair, prompt, fly_rule="paper")
        guarded, _ = run_fly(stories_pair, prompt, fly_rule="guarded", loose_min_ratio=0.0, loose_top_n=0,
                             cross_round=False)
        assert guarded.tokens == paper.tokens and guarded.stats.n_loose == paper.stats.n_loose, prompt
        assert guarded.stats.n_guard_rejected == 0


def test_every_loose_token_meets_the_ratio_floor(stories_pair):
    """Teacher-forced check of the floor on what a guarded generation kept loosely."""
    floor, kept, refused = 0.5, 0, 0
    for prompt in STORY_PROMPTS:
        gen, loose = run_fly(stories_pair, prompt, n=96, fly_rule="guarded", loose_min_ratio=floor)
        kept, refused = kept + len(loose), refused + gen.stats.n_guard_rejected
        if loose:
            score = stories_pair.score(stories_pair.tokenize(prompt), gen.tokens, top_n=1)
            for i in loose:
                assert score.logprobs[i] - score.top_logprobs[i, 0] >= math.log(floor) - 1e-4, (prompt, i)
    assert refused > 0  # the floor did refuse mismatches the paper's rule would have kept

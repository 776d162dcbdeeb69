"""k auto's rounds left to the target alone (the pacer's rest, ``Draft.alone``) decode as one
native run (``fly_cpp.rounds.runs``), not one Python round each: the same text as target-only greedy and
as the rounds one by one, every token streamed, stops and limits where they were, the pacer's
plans and the stats as if each token had been a round, and the draft model caught up after.
Real llama.cpp contexts on the bundled stories260K pair (and the kit's ``fast`` pair when built);
decisions are forced with priced costs (``Costs`` built here, in seconds), never timed."""

from __future__ import annotations

import copy

import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend import native
from fly_cpp.kauto.costs import Costs, Curve
from fly_cpp.models import bundled
from fly_cpp.rounds.runs import Runs

pytestmark = pytest.mark.skipif(not native.has_greedy_run(), reason=f"no native greedy runs: {native.status()}")
MS = 1e-3
# a draft that costs more than it could save (the Q4_K_M pair's shape): k auto never drafts and
# rests (``fly_cpp.kauto.planner``: the wait for a draw that could pay) between plans
NO_PAY = Costs(Curve((1, 2, 4, 6, 9, 16), (34 * MS, 58 * MS, 93 * MS, 133 * MS, 241 * MS, 271 * MS)),
               Curve((1, 2, 4, 8), (20 * MS, 30 * MS, 45 * MS, 80 * MS)))
# verifying is nearly free and a draft step costs a thousandth of a decode: drafting pays
PAYS = Costs(Curve((1, 2, 4, 8, 17), (1.0,) * 5), Curve((1, 32), (1e-3, 1e-3)))
PROMPTS = ["Once upon a time", "Lily and Tom went to the park", "The little dog was sad because"]
SPD = SpecSettings(mode="spd", ngram=False)
GREEDY = SamplingSettings(temperature=0)  # native runs decode greedy rounds


@pytest.fixture(autouse=True)
def own_evidence(tmp_path, monkeypatch):
    """Each test starts from the priors: no evidence another test (or process) left behind."""
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(tmp_path / "evidence.json"))


@pytest.fixture
def runs(monkeypatch):
    """The length bound of every run decoded (``Runs.run``'s ``most``)."""
    seen: list[int] = []
    plain = Runs.run

    def counted(self, committed, out, most=64):  # type: ignore[no-untyped-def]
        seen.append(most)
        return plain(self, committed, out, most)

    monkeypatch.setattr(Runs, "run", counted)
    return seen


@pytest.fixture(scope="module")
def pair():
    # n_ubatch=1: every verified row is computed as a one-token decode (the equivalences are exact)
    with Engine(ModelSettings(str(bundled.TARGET), n_ctx=512, n_ubatch=1), ModelSettings(str(bundled.DRAFT))) as e:
        yield e


def fresh_pacer(e: Engine, costs: Costs) -> None:
    """The engine's next paced generation starts a new pacer on (a copy of) ``costs``."""
    e.control.use(copy.copy(costs))


def generate(e: Engine, prompt: str, spec: SpecSettings, costs: Costs, n: int, **kw):
    fresh_pacer(e, costs)
    return e.generate(prompt, spec=spec, sampling=GREEDY, max_tokens=n, **kw).run()


def token_by_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "has_greedy_run", lambda: False)  # the rest of the library stays on


@pytest.mark.parametrize("spec", [SPD, SpecSettings(mode="fly", loosen="off", ngram=False), SpecSettings(mode="spd")])
def test_rounds_left_to_the_target_run_and_write_the_targets_text(pair, runs, spec):
    for prompt in PROMPTS:
        want = pair.generate(prompt, spec=SpecSettings(mode="target"), sampling=GREEDY, max_tokens=150).run()
        runs.clear()
        got = generate(pair, prompt, spec, NO_PAY, 150)
        assert got.tokens == want.tokens, prompt
        s = got.stats
        # the rest in runs, not 150 rounds; with n-gram guesses on, a round where they could pay
        # looks them up and rests no further (a run of 1), and whether they could pay turns on the
        # rounds' timings: the steps (runs and verified guesses) are bounded, not the runs alone
        steps = len(runs) + sum(n for k, n in s.draft_lengths.items() if k)
        assert runs and max(runs) > 1 and steps < (20 if not spec.ngram else 75), (runs, s.draft_lengths)
        assert s.n_rounds == len(s.accepted_lengths) == sum(s.draft_lengths.values())
        assert sum(s.accepted_lengths) == s.n_tokens + s.n_eog == 150


def test_the_pacer_and_the_stats_end_as_with_the_rounds_one_by_one(pair, runs, monkeypatch):
    """Without n-gram guesses the plans do not depend on timings: the same plans, rounds and
    draft lengths whether the rest is decoded in runs or round by round."""
    got = generate(pair, PROMPTS[1], SPD, NO_PAY, 120)
    assert runs
    token_by_token(monkeypatch)
    runs.clear()
    ref = generate(pair, PROMPTS[1], SPD, NO_PAY, 120)
    assert not runs and ref.tokens == got.tokens
    assert got.stats.pacing["plans"] == ref.stats.pacing["plans"]
    assert (got.stats.n_rounds, got.stats.draft_lengths) == (ref.stats.n_rounds, ref.stats.draft_lengths)
    assert got.stats.accepted_lengths == ref.stats.accepted_lengths


def test_streaming_yields_every_token_of_a_run(pair, runs):
    e = pair
    fresh_pacer(e, NO_PAY)
    steps = list(e.generate(PROMPTS[0], spec=SPD, sampling=GREEDY, max_tokens=90))
    want = e.generate(PROMPTS[0], spec=SpecSettings(mode="target"), sampling=GREEDY, max_tokens=90).run()
    assert runs and [s.token for s in steps] == want.tokens
    assert "".join(s.text for s in steps) == want.text


@pytest.mark.parametrize("n", [1, 2, 5, 33, 34, 100])
def test_max_tokens_lands_exactly(pair, runs, n):
    got = generate(pair, PROMPTS[2], SPD, NO_PAY, n)
    want = pair.generate(PROMPTS[2], spec=SpecSettings(mode="target"), sampling=GREEDY, max_tokens=n).run()
    assert got.tokens == want.tokens and len(got.tokens) == n and got.finish_reason == "length"


def test_a_stop_string_inside_a_run_ends_the_text_there(pair, runs):
    full = pair.generate(PROMPTS[0], spec=SpecSettings(mode="target"), sampling=GREEDY, max_tokens=120).run().text
    word = full.split()[15]
    got = generate(pair, PROMPTS[0], SPD, NO_PAY, 120, stop=[word])
    assert runs and got.text == full[: full.index(word)] and got.finish_reason == "stop"
    # the tokens a run decoded past the stop are rolled back: the next request reuses the cache
    again = generate(pair, PROMPTS[0] + " there", SPD, NO_PAY, 40)
    assert again.tokens == pair.generate(PROMPTS[0] + " there", spec=SpecSettings(mode="target"),
                                         sampling=GREEDY, max_tokens=40, cache_prompt=False).run().tokens


def test_the_draft_model_catches_up_after_a_run(pair, runs):
    """A pacer resting 40 rounds on a pair where drafting pays: the rest runs, then the draft
    model catches up on the run's tokens in its first step and drafts the target's text."""
    e = pair
    fresh_pacer(e, PAYS)
    pacer = e.drafter(SPD).pacer  # type: ignore[attr-defined]
    pacer.rest = 40
    got = e.generate(PROMPTS[1], spec=SPD, sampling=GREEDY, max_tokens=120).run()
    assert runs[0] == 40  # the 40 rounds of the rest, this one the first
    assert got.stats.n_drafted > 0 and got.stats.pacing["plans"]["draft"] > 0
    want = e.generate(PROMPTS[1], spec=SpecSettings(mode="target"), sampling=GREEDY, max_tokens=120).run()
    assert got.tokens == want.tokens


def test_the_draft_prompt_waits_while_a_rest_goes_on(pair, runs):
    """Where a rest goes on into the text the draft model's cache is not brought to the prompt
    before the rounds (no round drafts before the rest ends: the first that does catches up;
    work for nothing, and on a small CPU it evicts the target from the caches); where no rest
    is under way it is."""
    e = pair
    fresh_pacer(e, PAYS)
    pacer = e.drafter(SPD).pacer  # type: ignore[attr-defined]
    pacer.rest = 10_000
    got = e.generate(PROMPTS[1], spec=SPD, sampling=GREEDY, max_tokens=40, cache_prompt=False).run()
    assert got.stats.n_drafted == 0 and len(e.draft_ctx.tokens) == 0
    prompt = len(e.target_model.tokenize(PROMPTS[1])) - 1
    pacer.rest = 0
    e.generate(PROMPTS[1], spec=SPD, sampling=GREEDY, max_tokens=40, cache_prompt=False).run()
    assert len(e.draft_ctx.tokens) >= prompt
    # a loosening rule asks the draft model for its token where the target was unsure: it needs the prompt
    loose = SpecSettings(mode="fly", loosen="on")
    fly = e.drafter(loose).pacer  # type: ignore[attr-defined]
    fly.rest = 10_000
    # (two tokens: the first may come from the prompt's row, before the rounds and the draft's prompt)
    e.generate(PROMPTS[1], spec=loose, sampling=GREEDY, max_tokens=2, cache_prompt=False).run()
    assert len(e.draft_ctx.tokens) >= prompt


def test_a_loosening_fly_keeps_its_rounds(pair, runs):
    """FLy's rule may keep the draft model's own token where the target decoded alone: no runs."""
    spec = SpecSettings(mode="fly", loosen="on", ngram=False)
    got = generate(pair, PROMPTS[0], spec, NO_PAY, 60)
    assert not runs and len(got.tokens) == 60


def test_the_fast_pair_runs_its_rest(runs):
    from fly_cpp.models import kit

    fast = kit.built("fast")
    if fast is None:
        pytest.skip("the kit's fast pair is not built (fly-cpp models make-pair fast)")
    with Engine(ModelSettings(str(fast.target), n_ctx=256, n_ubatch=1), ModelSettings(str(fast.draft))) as e:
        want = e.generate(PROMPTS[1], spec=SpecSettings(mode="target"), sampling=GREEDY, max_tokens=80).run()
        got = generate(e, PROMPTS[1], SpecSettings(mode="spd"), NO_PAY, 80)
        assert got.tokens == want.tokens and runs
        assert got.stats.n_rounds == len(got.stats.accepted_lengths) and got.stats.draft_lengths.get(0, 0) > 40

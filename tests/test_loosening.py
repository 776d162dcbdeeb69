"""Whether k auto's fly loosens, from what loosening would gain on the pair
(``fly_cpp.kauto.loosening``): a typical pair's acceptance with and without it, priced with the pair's
costs (no probe), decided once and kept, so the same request gives the same text in every process."""

from __future__ import annotations

import threading

import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.kauto import loosening, worth
from fly_cpp.kauto.costs import Costs, Curve

ROWS = (1, 2, 4, 8, 16, 32)
GREEDY = SamplingSettings(temperature=0)


def costs(target: tuple[float, ...], draft: tuple[float, ...]) -> Costs:
    return Costs(Curve(ROWS, target), Curve(ROWS, draft))


# verification nearly free, a draft step 1/17 of a decode (an 8B F16 target on a GPU: ASSUMED)
GPU_SHAPED = costs((3.4e-3, 3.42e-3, 3.46e-3, 3.55e-3, 3.75e-3, 4.3e-3), (2e-4, 2.1e-4, 2.2e-4, 2.4e-4, 2.8e-4, 3.6e-4))
# every verified row dear and a draft step 1/5 of a decode (a memory-bound target on a small CPU)
CPU_SHAPED = costs((0.05, 0.06, 0.08, 0.12, 0.2, 0.36), (0.01, 0.012, 0.016, 0.024, 0.04, 0.07))


def tally(exact: float, loose: float, unsure: float, n: int = 100) -> loosening.Tally:
    return loosening.Tally(n, round(exact * n), round((loose - exact) * n), round(unsure * n))


def test_a_tally_counts_the_mismatches_the_rule_would_keep():
    """A mismatch counts as kept loosely where the gate and the safeguards pass it and the draft
    matched the target over the rest of its window (W-1 positions) after it."""
    x, o = True, False
    exact = [x, o, x, x, x, x, x, o, x, x, o, x]
    admitted = [o, x, o, o, o, o, o, x, o, o, x, o]  # the three mismatches pass the gate
    t = loosening.Tally.of(exact, admitted, [True] * 6 + [False] * 6, window=6)
    assert (t.positions, t.exact, t.loose, t.unsure) == (12, 9, 1, 6)  # 7's and 10's windows run past the end
    assert t.shares() == (9 / 12, 10 / 12, 0.5)
    assert (t + t).shares() == t.shares() and loosening.Tally().shares() == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("shape, loosens", [(GPU_SHAPED, True), (CPU_SHAPED, False)])
def test_loosening_pays_where_long_rounds_pay(shape, loosens):
    """The same gain in acceptance (0.80 -> 0.86) pays where verification is nearly free and a
    draft step cheap (rounds long enough for a window pay anyway), not where every verified row
    and draft step is dear (the window's forced length costs more than it keeps)."""
    verdict = loosening.Verdict.priced(shape, tally(0.80, 0.86, 0.3), SpecSettings())
    assert verdict.loosen is loosens
    assert verdict.describe().startswith("fly loosens" if loosens else "fly matches exactly")
    assert not loosening.Verdict.priced(GPU_SHAPED, tally(0.8, 0.8, 0.3), SpecSettings()).loosen  # no gain, no loosening


def test_asks_cost_a_draft_step_each():
    """The same acceptances pay less the more often the target is unsure (each loosened round
    asks the draft model's token there), and not at all where a draft step is dear."""
    exact, calm = worth.loosening(GPU_SHAPED, 0.8, 0.82, 0.0, 6, 16)
    assert worth.loosening(GPU_SHAPED, 0.8, 0.82, 1.0, 6, 16) == (exact, pytest.approx(calm * 0.95, rel=0.02))
    assert loosening.Verdict.priced(GPU_SHAPED, tally(0.8, 0.82, 0.0), SpecSettings()).loosen
    dear = costs(GPU_SHAPED.target_curve.seconds, tuple(4 * s for s in GPU_SHAPED.draft_curve.seconds))
    assert not loosening.Verdict.priced(dear, tally(0.8, 0.82, 1.0), SpecSettings()).loosen


@pytest.mark.parametrize("step, loosens", [(2e-4, True), (1e-3, False)])
def test_a_head_loosens_where_its_step_is_a_small_share_of_a_decode(step, loosens):
    """A head's step is priced as a draft model's: 0.06 of a target decode loosens, 0.3 does not."""
    head = costs(GPU_SHAPED.target_curve.seconds, tuple(step * (1 + r / 64) for r in ROWS))
    assert loosening.Verdict.priced(head, loosening.PRIOR, SpecSettings()).loosen is loosens


def test_the_prior_shares_loosen_where_drafts_and_rows_are_cheap_and_not_on_a_cpu():
    """With nothing measured, the costs decide: GPU-shaped ones loosen, CPU-shaped ones match exactly."""
    assert loosening.Verdict.priced(GPU_SHAPED, loosening.PRIOR, SpecSettings()).loosen
    assert not loosening.Verdict.priced(CPU_SHAPED, loosening.PRIOR, SpecSettings()).loosen


@pytest.fixture()
def kept(tmp_path, monkeypatch):
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    return tmp_path / "loosening.json"


def engine(stories, stories_draft) -> Engine:
    return Engine(ModelSettings(path=str(stories), n_ctx=512), ModelSettings(path=str(stories_draft), n_ctx=512))


def test_the_verdict_is_priced_without_a_probe_and_kept(stories, stories_draft, kept, monkeypatch):
    """The first k auto fly generation on a pair decodes nothing for the verdict: it is priced at
    the prior's costs and kept (to be priced again once); the next process, whose costs the first
    one's live decodes taught, prices it at them once; later processes read it, writing the same
    text."""
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(kept.parent / "evidence.json"))
    monkeypatch.setattr("fly_cpp.kauto.calibrate.FLAT", 0.0)  # a busy test machine must not keep the learned curve out
    with engine(stories, stories_draft) as first:
        tokens = first.tokenize("Once upon a time")
        first.prefill(tokens)
        # 64 tokens: enough warm decodes of each kind (three) to learn the curves; 24 drafted half
        # their rounds and timed too few one-row decodes to say
        gen = first.generate(tokens, sampling=GREEDY, max_tokens=64).run()
        assert gen.stats.n_cached >= len(tokens) - 1  # nothing decoded before the rounds
        verdict = first.steps.call(lambda at: first.control.verdict(SpecSettings(), at))
        assert not verdict.learned and "prior" in verdict.why
    assert loosening.recall(loosening.key(first.control.cost_key(), SpecSettings())) == verdict
    with engine(stories, stories_draft) as second:
        second.generate(tokens, sampling=GREEDY, max_tokens=64).run()
        learned = second.steps.call(lambda at: second.control.verdict(SpecSettings(), at))
        assert learned.learned and "learned" in learned.why
        now = second.generate(tokens, sampling=GREEDY, max_tokens=64).run()
    with engine(stories, stories_draft) as third:
        again = third.generate(tokens, sampling=GREEDY, max_tokens=64).run()
        assert third.steps.call(lambda at: third.control.verdict(SpecSettings(), at)) == learned
    assert again.tokens == now.tokens and again.stats.loosens == now.stats.loosens == learned.loosen


@pytest.mark.parametrize("loosen", [True, False])
def test_k_auto_fly_loosens_as_the_kept_verdict_says(stories, stories_draft, kept, loosen):
    """A kept verdict decides: loosening on (the rule may keep mismatches) or off (spd's text)."""
    with engine(stories, stories_draft) as e:
        spec = SpecSettings(entropy_threshold=0.0, loose_min_ratio=0.0)
        loosening.keep(loosening.key(e.control.cost_key(), spec), loosening.Verdict(loosen, "kept by the test"))
        fly = e.generate("Once upon a time", spec=spec, sampling=GREEDY, max_tokens=48).run()
        spd = e.generate("Once upon a time", spec=SpecSettings(mode="spd"), sampling=GREEDY, max_tokens=48).run()
    assert fly.stats.loosens is loosen
    if not loosen:
        assert fly.tokens == spd.tokens and fly.stats.n_loose == 0


def test_slots_starting_together_run_by_one_verdict(stories, stories_draft, kept):
    """Two slots' first k auto fly generations at once: one verdict, kept, and both run by it."""
    with Engine(ModelSettings(path=str(stories), n_ctx=512), ModelSettings(path=str(stories_draft), n_ctx=512),
                n_seq=2) as e:
        gens = [e.generate(prompt, max_tokens=16, slot=slot) for slot, prompt in enumerate(["Once upon", "Lily saw"])]
        runs = [threading.Thread(target=g.run) for g in gens]
        for run in runs:
            run.start()
        for run in runs:
            run.join()
        verdict = loosening.recall(loosening.key(e.control.cost_key(), SpecSettings()))
    assert verdict is not None and gens[0].stats.loosens == gens[1].stats.loosens == verdict.loosen

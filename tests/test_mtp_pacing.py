"""k auto with the target's own MTP head as the drafter, on real llama.cpp contexts over the kit's
synthetic qwen35-mtp: the head's step is priced by its own measured curve (cached under the
pair's key beside the target's), its acceptance learned as a draft model's, and what it learns
kept per pair. Decisions are asserted on priced costs (``Costs`` built here, in seconds), never
on times; ``n_ubatch=1`` makes every decode numerically a one-token decode."""

from __future__ import annotations

import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.kauto import costcache
from fly_cpp.kauto.costs import Costs, Curve
from fly_cpp.kauto.evidence import Evidence

PROMPTS = ["Hello world, this is a test of the hybrid model.", "def fib(n):\n    return", "The capital of France is"]
ROWS = (1, 2, 4, 8, 17)
GREEDY = SamplingSettings(temperature=0)


def engine(path, **extra) -> Engine:
    return Engine(ModelSettings(str(path), n_ctx=1024, n_ubatch=1, rollback="checkpoints"), **extra)


def priced(head_seconds: float) -> Costs:
    """A target whose batches cost one decode (memory-bound, as on a GPU: verifying is nearly free)
    and a head step of ``head_seconds``."""
    return Costs(Curve(ROWS, (1.0,) * len(ROWS)), Curve((1, 32), (head_seconds, head_seconds)))


@pytest.fixture(autouse=True)
def own_evidence(tmp_path, monkeypatch):
    """Each test starts from the priors: no evidence another test (or process) left behind."""
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(tmp_path / "evidence.json"))


def run(e: Engine, spec: SpecSettings, prompt: str, n: int = 40):
    """A greedy generation of ``prompt``."""
    return e.generate(prompt, spec=spec, max_tokens=n, sampling=GREEDY, cache_prompt=False).run()


def test_k_auto_prices_the_head_by_its_own_measured_curve_cached_under_the_pairs_key(qwen35_mtp, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setattr("fly_cpp.kauto.costs.MAX_PER_ROW", float("inf"))  # a busy test machine must not keep it out of the cache
    monkeypatch.setattr("fly_cpp.kauto.calibrate.FLAT", 0.0)
    with engine(qwen35_mtp) as e:
        assert e.mtp_ctx is not None and e.draft_ctx is None
        run(e, SpecSettings(mode="spd", k=3, ngram=False), PROMPTS[1], 8)
        before = e.costs()  # nothing cached: the prior prices the head from the target's header
        assert before.prior and before.draft_curve is not None and 0 < before.draft(1) < before.target(1)
        held = list(e.mtp_ctx.tokens)
        costs = e.costs(refresh=True)
        assert e.mtp_ctx.tokens == held  # measuring the head leaves its cache as it was
        entry = costcache.load()[e.control.cost_key()]
        assert entry["draft"] is None and entry["mtp"]["rows"] == [1, 2, 4, 8, 16, 32]
        assert costs.draft_curve is not None and costs.draft(1) > 0
        got = run(e, SpecSettings(mode="spd", ngram=False), PROMPTS[0], 24)
        assert got.stats.drafter == "mtp" and got.stats.pacing is not None
        assert got.stats.pacing["costs"]["draft_ms"] == costs.draft_curve.as_dict()
    with engine(qwen35_mtp) as again:  # a new process reads it back, measuring nothing
        cached = again.costs()
        assert cached.cached and cached.draft_curve == costs.draft_curve


@pytest.mark.parametrize("mode, ngram", [("spd", False), ("spd", True), ("fly", False)])
def test_greedy_k_auto_with_mtp_drafts(qwen35_mtp, mode, ngram):
    """spd under k auto is the target token for token (n-gram guesses chained in front or not);
    fly's guarded rule decides on the text alone, so k auto's plans give fixed k's text, loose
    accepts included (its gate opened wide so that random weights give some). Priced so that
    drafting pays, the head drafts."""
    loose = dict(entropy_threshold=0.0, loose_min_ratio=0.0, loosen="on") if mode == "fly" else {}
    with engine(qwen35_mtp) as e:
        e.control.use(priced(1e-3))
        drafted = kept_loosely = 0
        for prompt in PROMPTS:
            auto = run(e, SpecSettings(mode=mode, ngram=ngram, **loose), prompt)
            assert auto.stats.drafter == "mtp"
            drafted, kept_loosely = drafted + auto.stats.n_drafted, kept_loosely + auto.stats.n_loose
            if mode == "spd":
                want = run(e, SpecSettings(mode="target"), prompt).tokens
            else:
                want = run(e, SpecSettings(mode="fly", k=3, ngram=False, **loose), prompt).tokens
            assert auto.tokens == want, prompt
        assert drafted > 0 and (kept_loosely > 0 or mode == "spd")
        assert max(int(h) for h in auto.stats.draft_lengths) > 1  # as far as it pays, not one token at a time


def test_an_expensive_head_step_is_not_drafted(qwen35_mtp):
    """The same head, its step priced at ten target decodes: no draft length can pay, so k auto
    neither drafts nor explores; priced at a thousandth of one, it drafts from the first round."""
    plans = {}
    for name, head in (("cheap", 1e-3), ("dear", 10.0)):
        with engine(qwen35_mtp) as e:
            e.control.use(priced(head))
            got = run(e, SpecSettings(mode="spd", ngram=False), PROMPTS[1])
            plans[name] = (got.stats.n_drafted, got.stats.pacing["plans"])
            assert got.tokens == run(e, SpecSettings(mode="target"), PROMPTS[1]).tokens
    (cheap, cheap_plans), (dear, dear_plans) = plans["cheap"], plans["dear"]
    assert dear == 0 and dear_plans["draft"] == dear_plans["explore"] == 0
    assert cheap > 0 and cheap_plans["draft"] > 0


def test_what_the_head_taught_persists_per_pair(qwen35_mtp):
    spec = SpecSettings(mode="spd", ngram=False)
    with engine(qwen35_mtp) as e:
        e.control.use(priced(1e-3))
        pacer = e.drafter(spec).pacer  # the pair's: every generation's drafter shares it
        run(e, spec, PROMPTS[2])
        e.steps.call(lambda at: e.control.save())  # kept now, as once the loop is idle
        learned = pacer.evidence.as_dict()  # read without a new text, which would age it
    assert learned != Evidence().as_dict()
    with engine(qwen35_mtp) as again:  # as a new process would load it
        assert again.drafter(spec).pacer.evidence.as_dict() == learned
        assert again.drafter(SpecSettings(mode="fly", ngram=False)).pacer.evidence.as_dict() == Evidence().as_dict()


def test_k_auto_fly_matches_exactly_where_a_head_step_costs_a_decode(qwen35_mtp):
    """On the synthetic model a head step touches nearly all the target (its output matrix), so
    asking the head at every unsure position cannot pay: k auto's fly is spd's text there
    (decided once from the head's measured step, then kept); a fixed k keeps loosening."""
    with engine(qwen35_mtp) as e:
        spec = SpecSettings(mode="fly", entropy_threshold=0.0, loose_min_ratio=0.0)
        verdict = e.steps.call(lambda at: e.control.verdict(spec, at))  # on the step loop, as a request
        assert not verdict.loosen
        for prompt in PROMPTS[:2]:
            auto = run(e, SpecSettings(mode="fly", entropy_threshold=0.0, loose_min_ratio=0.0), prompt, 24)
            assert auto.stats.n_loose == 0 and auto.stats.n_asked == 0
            assert auto.text == run(e, SpecSettings(mode="spd"), prompt, 24).text

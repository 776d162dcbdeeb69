"""Drafters on a real llama.cpp context: greedy drafts, the n-gram guess checked by the draft
model, p_min, end-of-text, the limit, and the cache invariant they keep."""

from __future__ import annotations

import numpy as np
import pytest

from fly_cpp import Engine, ModelSettings
from fly_cpp.engine import control as control_module
from fly_cpp.backend import native
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.config import SamplingSettings, SpecSettings
from fly_cpp.kauto.costs import Costs, Curve
from fly_cpp.drafters.draft_model import DraftModel
from fly_cpp.drafters.drafter import PairDrafter
from fly_cpp.drafters.seam import DraftRules, Report
from fly_cpp.kauto.pacer import Pacer

GREEDY = SamplingSettings(temperature=0)


@pytest.fixture(scope="module")
def model(stories_draft):
    with Model(stories_draft) as m:
        yield m


def drafter_on(ctx: Context, spec: SpecSettings, pacer: Pacer | None = None) -> PairDrafter:
    return PairDrafter(DraftModel(ctx, ctx.model.n_vocab), DraftRules.of(spec), pacer=pacer)


def greedy(model: Model, committed: list[int], n: int) -> list[int]:
    """The draft model's own greedy continuation, one token at a time."""
    with Context(model, n_ctx=256, n_threads=1) as ctx:
        out, seq = [], list(committed)
        for _ in range(n):
            logits = ctx.decode(seq[len(ctx.tokens):], logits="last")
            out.append(int(np.argmax(logits[0])))
            seq.append(out[-1])
        return out


@pytest.mark.parametrize("ngram", [False, True])
def test_model_drafter_drafts_its_greedy_continuation(model, ngram):
    committed = model.tokenize("Once upon a time, there was a girl. Once upon a time")
    with Context(model, n_ctx=256, n_threads=1, n_ubatch=1) as ctx:
        drafter = drafter_on(ctx, SpecSettings(k=8, ngram=ngram))
        drafted = drafter.draft(committed, 8).tokens
        assert len(drafted) <= 8 and drafted == greedy(model, committed, len(drafted))
        assert ctx.tokens == committed + drafted[:-1]  # invariant: the last drafted token is not fed yet
        more = drafter.draft(committed + drafted[:3], 5).tokens  # a later round reuses the common prefix
        assert more == greedy(model, committed + drafted[:3], len(more)) and len(more) <= 5


@pytest.mark.parametrize("checks", [0, 1])
def test_a_fixed_k_checks_only_the_guess_tokens_it_is_given(model, monkeypatch, checks):
    """``checks`` bounds the guess a draft step checks (0: one row a step, as llama.cpp drafts);
    the tokens drafted are the same: an agreed guess token is the draft's own greedy token."""
    monkeypatch.setattr(native, "has_draft_run", lambda: False)  # the Python steps, to see each one
    seen: list[int] = []
    step = DraftModel.step

    def counted(self, catchup, history, guess, confident=False):
        seen.append(len(guess))
        return step(self, catchup, history, guess, confident)

    monkeypatch.setattr(DraftModel, "step", counted)
    committed = model.tokenize("Once upon a time, there was a girl. Once upon a time, there was a")
    with Context(model, n_ctx=256, n_threads=1, n_ubatch=1) as ctx:
        drafted = PairDrafter(DraftModel(ctx, ctx.model.n_vocab), DraftRules.of(SpecSettings(k=8)), checks).draft(committed, 8).tokens
    assert seen and max(seen) <= checks and (checks == 0 or max(seen) == checks)  # the text repeats: a guess is found
    assert drafted == greedy(model, committed, len(drafted))


def test_a_fixed_k_prices_its_guess_checks_by_the_pairs_cached_costs(stories, stories_draft, monkeypatch):
    """Where a two-row draft decode costs 2.4x a one-row one (the Q4_K_M draft on a 2-core CPU)
    no guess pays at the prior agreement; where rows are nearly free, a whole guess does; with no
    cached curve nothing is measured and every step checks as before."""
    ms = 1e-3
    dear = Costs(Curve((1, 2, 4, 8), (80 * ms, 87 * ms, 103 * ms, 155 * ms)), Curve((1, 2, 4, 8), (16 * ms, 38 * ms, 51 * ms, 70 * ms)))
    flat = Costs(Curve((1, 2, 4, 8), (80 * ms, 81 * ms, 82 * ms, 84 * ms)), Curve((1, 2, 4, 8), (16 * ms, 16.2 * ms, 16.4 * ms, 17 * ms)))
    with Engine(ModelSettings(str(stories), n_ctx=256), ModelSettings(str(stories_draft), n_ctx=256)) as engine:
        for found, least, most in ((dear, 0, 0), (flat, 4, 6), (None, 6, 6)):
            monkeypatch.setattr(control_module, "cached", lambda *a, found=found, **k: found)
            assert least <= engine.drafter(SpecSettings(mode="spd", k=5)).checks <= most
        monkeypatch.setattr(control_module, "cached", lambda *a, **k: pytest.fail("k auto prices each step itself"))
        engine.drafter(SpecSettings(mode="spd"))


def test_p_min_stops_an_unsure_draft(model):
    committed = model.tokenize("Once upon a time")
    with Context(model, n_ctx=256, n_threads=1) as ctx:
        sure = drafter_on(ctx, SpecSettings(k=15, ngram=False, p_min=0.0)).draft(committed, 15).tokens
        picky = drafter_on(ctx, SpecSettings(k=15, ngram=False, p_min=0.99)).draft(committed, 15).tokens
        assert len(sure) == 15 and len(picky) < 15 and sure[: len(picky)] == picky


@pytest.mark.parametrize("ngram", [False, True])
def test_a_draft_ends_at_end_of_text(period_is_eos, ngram):
    with Model(period_is_eos) as m, Context(m, n_ctx=256, n_threads=1) as ctx:
        committed = m.tokenize("Once upon a time")
        drafted = drafter_on(ctx, SpecSettings(k=15, ngram=ngram)).draft(committed, 40).tokens
        assert m.is_eog(drafted[-1]) and not any(m.is_eog(t) for t in drafted[:-1])  # '.' ends the first sentence


def test_ngram_drafter_copies_from_the_context():
    d = PairDrafter(None, DraftRules.of(SpecSettings(ngram_max=3, ngram_tokens=4)))
    assert d.draft([1, 2, 3, 4, 5, 6, 1, 2, 3], 10).tokens == [4, 5, 6, 1]
    assert d.draft([1, 2, 3, 4, 5, 6, 1, 2, 3], 2).tokens == [4, 5]
    assert d.draft([1, 2, 3], 4).tokens == []


def test_a_paced_draft_learns_its_agreement_with_guesses_it_left_unchecked(model):
    """With the agreement low the pacer checks no guess; the draft's own tokens still say
    whether the n-gram guesses were right, so the agreement can climb back."""
    costs = Costs(Curve((1, 2, 4, 8), (0.086, 0.143, 0.161, 0.19)), Curve((1, 2, 4, 8), (0.02, 0.03, 0.045, 0.08)))
    pacer = Pacer(lambda: costs, k_max=16)
    for _ in range(20):
        pacer.agree.observe([None], 0)
    assert pacer.guess_length(6, 0) == 0
    committed = model.tokenize("Once upon a time, there was a girl. Once upon a time, there was a girl. Once upon a time")
    with Context(model, n_ctx=256, n_threads=1) as ctx:
        drafter = drafter_on(ctx, SpecSettings(k=8))
        drafter.draft(committed, 1)  # the cache holds the text: no catch-up to share a decode with
        assert pacer.guess_length(6, 0) == 0
        seen = pacer.agree.all_trials
        paced = drafter_on(ctx, SpecSettings(k=8), pacer)
        paced._paced(pacer, drafter.stepper, committed, 8, 0)
        assert pacer.agree.all_trials > seen  # evidence, though no guess was checked
        assert pacer.agree.all_hits > 0  # the draft went on as the earlier text did


def test_a_steady_round_checks_the_guess_tokens_that_pay(model, monkeypatch):
    """k auto's steady rounds (a GPU's) draft with the draft model's own rounds (``own``): their
    guess checks are priced by the agreement learned, as the paced steps' are."""
    costs = Costs(Curve((1, 2, 4, 8), (0.086, 0.143, 0.161, 0.19)), Curve((1, 2, 4, 8), (0.02, 0.03, 0.045, 0.08)))
    pacer = Pacer(lambda: costs, k_max=16)
    for _ in range(20):
        pacer.agree.observe([None], 0)
    monkeypatch.setattr(pacer, "plan", lambda *a, **k: ("steady", 4))
    committed = model.tokenize("Once upon a time, there was a girl. Once upon a time")
    with Context(model, n_ctx=256, n_threads=1) as ctx:
        drafter = drafter_on(ctx, SpecSettings(k=8), pacer)
        checks, own = [], drafter.own
        monkeypatch.setattr(drafter, "own", lambda *a, **k: checks.append(k.get("checks")) or own(*a, **k))
        drafter.draft(committed, 8)
        assert checks == [0] and drafter.checks == 6  # this round's, told with the round: the drafter's own unchanged


def test_guesses_pay_alone_where_the_draft_model_cannot(model):
    """On a compute-bound target no draft from the draft model pays, but a guess copied from
    earlier in the text costs no draft step: the guesses the rounds did not verify tell the
    pacer how often those that continue a long match are right, and then they are verified."""
    ms = 1e-3  # a 1.5B Q4_K_M target and a 0.5B draft on a 2-core CPU
    costs = Costs(Curve((1, 2, 4, 6, 9, 16), (34 * ms, 58 * ms, 93 * ms, 133 * ms, 241 * ms, 271 * ms)),
                  Curve((1, 2, 4, 8), (20 * ms, 30 * ms, 45 * ms, 80 * ms)))
    pacer = Pacer(lambda: costs, k_max=16)
    assert pacer.best(1.0, 16, costs.draft(1), costs.draft(1))[1] == 0  # not even an always-right draft pays
    with Context(model, n_ctx=256, n_threads=1) as ctx:
        drafter = drafter_on(ctx, SpecSettings(), pacer)
        pattern = [10, 11, 12, 13, 14, 15, 16]
        text, kinds = pattern * 2, []
        for _ in range(300):
            draft = drafter.draft(text, 8)
            wrote = len(draft) + 1  # the target goes on repeating, as the guesses say
            text = text + [pattern[(len(text) + i) % len(pattern)] for i in range(wrote)]
            drafter.accept(Report(draft, len(draft), len(draft), text, 0.0, 0.03, 0.03, wrote))
            kinds.append(drafter.last_kind)
    assert "draft" not in kinds and "ngram" in kinds
    assert set(pacer.guesses.trials) == {4}


def test_a_callers_own_paced_drafter_runs_in_a_generation(stories, stories_draft):
    """A paced drafter made by the caller (its own pacer, not the engine's) drafts a generation
    and leaves its pacing in the stats; it learns for itself, so nothing is stored for the
    next process."""
    spec = SpecSettings(mode="spd")
    with Engine(ModelSettings(str(stories), n_ctx=256), ModelSettings(str(stories_draft), n_ctx=256)) as engine:
        costs = Costs(Curve((1, 2, 4, 8), (1e-3, 1.1e-3, 1.3e-3, 1.8e-3)), Curve((1, 2, 4), (1e-4, 1.2e-4, 1.5e-4)))
        own = PairDrafter(None, DraftRules.of(spec), pacer=Pacer(lambda: costs, k_max=16))
        alone = engine.generate("Once upon a time", spec=SpecSettings(mode="target"), sampling=GREEDY,
                                max_tokens=24).run()
        gen = engine.generate("Once upon a time", spec=spec, sampling=GREEDY, max_tokens=24, drafter=own).run()
    assert gen.tokens == alone.tokens
    assert gen.stats.pacing is not None and sum(gen.stats.pacing["plans"].values()) > 0

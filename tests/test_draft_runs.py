"""Native draft runs (``DraftModel.run``, ``fly_draft_run``): a fixed-k round of drafting (greedy,
or drawn with the target's shared draw) inside the library gives exactly the Python steps' tokens
and confidences, and leaves the draft cache and the path it drafted along as they do, on real
llama.cpp contexts."""

from __future__ import annotations

import numpy as np
import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend import native
from fly_cpp.drafters import ngram
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.backend.sampling import draft_sampler
from fly_cpp.drafters.draft_model import DraftModel
from fly_cpp.drafters.drafter import PairDrafter
from fly_cpp.models import bundled
from fly_cpp.drafters.seam import DraftRules

pytestmark = pytest.mark.skipif(not native.has_draft_run(), reason=f"no native draft runs: {native.status()}")
PROMPT = "Once upon a time, there was a little girl named Lily. She liked to play with her ball. One day"
GREEDY = SamplingSettings(temperature=0)


@pytest.fixture(scope="module")
def draft_path():
    return bundled.DRAFT


def _drafter(model: Model, spec: SpecSettings, n_batch: int, checks: int | None = None,
             n_vocab: int | None = None, sampling: SamplingSettings | None = None) -> PairDrafter:
    ctx = Context(model, n_ctx=512, n_threads=1, n_batch=n_batch)
    draws = draft_sampler(sampling, sampling.seed) if sampling is not None else None
    return PairDrafter(DraftModel(ctx, n_vocab or model.n_vocab, draws=draws), DraftRules.of(spec), checks)


def _python_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "has_draft_run", lambda: False)  # the library stays on for its row functions


def _compare(model: Model, spec: SpecSettings, monkeypatch: pytest.MonkeyPatch, *, n_batch: int = 512,
             rounds: int = 24, seed: int = 0, checks: int | None = None, n_vocab: int | None = None,
             sampling: SamplingSettings | None = None) -> int:
    """Draft a generation's rounds both ways, each drafter on its own context, committing the same
    (random) part of each draft and a correction; returns the tokens drafted. ``n_vocab``: the ids
    the target knows (the argmax reads those; the confidence reads the whole row); ``sampling``:
    the generation's (at T > 0 under the shared draw the draft draws its tokens as the target)."""
    rng = np.random.default_rng(seed)
    fast, slow = (_drafter(model, spec, n_batch, checks, n_vocab, sampling) for _ in range(2))
    committed = model.tokenize(PROMPT)
    drafted = 0
    try:
        assert fast.stepper.ctx.drafts_natively
        for r in range(rounds):
            limit, need, confident = int(rng.integers(1, 9)), int(rng.integers(0, 3)), bool(rng.integers(0, 2))
            a = fast.own(committed, limit, need, confident)
            with monkeypatch.context() as m:
                _python_steps(m)
                b = slow.own(committed, limit, need, confident)
            assert a == b, (r, limit, need, confident)
            for d in (fast.stepper, slow.stepper):
                assert d.ctx.tokens == d.ctx.tokens[: len(d.path) - 1] and d.ctx.tokens == d.path[:-1]
            assert fast.stepper.ctx.tokens == slow.stepper.ctx.tokens
            # the run's cache shares the text's and the draft's int objects (compared by identity each round)
            fast_tokens = fast.stepper.ctx.tokens
            assert all(x is y for x, y in zip(fast_tokens, [*committed, *a.tokens]))
            assert (fast.stepper.path, fast.stepper._own) == (slow.stepper.path, slow.stepper._own)
            drafted += len(a)
            kept = int(rng.integers(0, len(a) + 1))
            correction = int(rng.integers(3, model.n_vocab))
            if rng.random() < 0.5:  # the draft's own token there (read off the path, or one Python step)
                correction = fast.candidate([*committed, *a.tokens[:kept]])
                assert slow.candidate([*committed, *a.tokens[:kept]]) == correction
            committed = [*committed, *a.tokens[:kept], correction]
            if len(committed) > 400:
                committed = committed[:60]  # a new request sharing part of the text
    finally:
        fast.stepper.ctx.close()
        slow.stepper.ctx.close()
    return drafted


@pytest.mark.parametrize("ngram", [False, True])
@pytest.mark.parametrize("p_min", [0.0, 0.4, 0.8])
def test_draft_runs_equal_the_python_steps(draft_path, monkeypatch, ngram, p_min):
    with Model(draft_path) as model:
        spec = SpecSettings(mode="spd", k=8, ngram=ngram, p_min=p_min, ngram_max=3 if p_min == 0.4 else 4,
                            ngram_tokens=3 if p_min else 6)
        assert _compare(model, spec, monkeypatch, seed=int(p_min * 10) + ngram) > 0


@pytest.mark.parametrize("ngram", [False, True])
@pytest.mark.parametrize("temperature,p_min,scale", [(0.3, 0.0, 1), (0.8, 0.0, 1), (0.8, 0.5, 1), (0.8, 0.0, 0.6),
                                                     (1.5, 0.0, 1)])
def test_sampled_draft_runs_equal_the_python_steps(draft_path, monkeypatch, ngram, temperature, p_min, scale):
    """At T > 0 under the shared draw a run draws each token as the Python steps draw it (the
    target's chain on the draft's row, the seed's noise at the token's position; cooler where
    ``draft_temp_scale`` says): the same tokens, confidences, cache and path; and they are not the argmax's."""
    with Model(draft_path) as model:
        spec = SpecSettings(mode="spd", k=8, ngram=ngram, p_min=p_min)
        sampling = SamplingSettings(temperature=temperature, seed=17 + int(temperature * 10), draw="shared",
                                    draft_temp_scale=scale)
        assert draft_sampler(sampling, sampling.seed) is not None
        assert _compare(model, spec, monkeypatch, seed=21 + ngram, sampling=sampling) > 0
        if temperature > 1:  # hot enough that 8 drawn tokens are not all the argmax's
            drawn, greedy = (_drafter(model, spec, 512, sampling=s) for s in (sampling, None))
            try:
                committed = model.tokenize(PROMPT)
                assert drawn.own(committed, 8).tokens != greedy.own(committed, 8).tokens
            finally:
                drawn.stepper.ctx.close()
                greedy.stepper.ctx.close()


def test_penalised_draws_step_in_python(draft_path):
    """Penalties read the history token by token: those draws stay in Python."""
    with Model(draft_path) as model, Context(model, n_ctx=128, n_threads=1) as ctx:
        committed = model.tokenize(PROMPT)
        spec = SpecSettings(mode="spd", k=4)
        for sampling, runs in ((SamplingSettings(temperature=0.8, seed=1), True),
                               (SamplingSettings(temperature=0.8, seed=1, repeat_penalty=1.2), False)):
            drafts = DraftModel(ctx, model.n_vocab, draws=draft_sampler(sampling, 1))
            drafts.start(committed)
            assert (drafts.run(committed, 4, 0, spec, False) is not None) == runs


@pytest.mark.parametrize("checks", [0, 2])
def test_draft_runs_check_as_many_guess_tokens_as_the_python_steps(draft_path, monkeypatch, checks):
    """A fixed k whose guess checks are priced (``PairDrafter.checks``): none, or at most 2 a step."""
    with Model(draft_path) as model:
        assert _compare(model, SpecSettings(mode="spd", k=8), monkeypatch, seed=7 + checks, checks=checks) > 0


def test_a_draft_whose_rows_are_longer_than_the_targets_vocabulary(draft_path, monkeypatch):
    """The argmax reads the ids the target knows; the confidence, the whole row (its peak then
    found by a pass of its own, not read off the argmax)."""
    with Model(draft_path) as model:
        spec = SpecSettings(mode="spd", k=8, p_min=0.4)
        assert _compare(model, spec, monkeypatch, seed=11, n_vocab=model.n_vocab - 200) > 0


def test_small_batches_split_as_decode_does(draft_path, monkeypatch):
    """A catch-up longer than a batch, and guesses cut to the batch."""
    with Model(draft_path) as model:
        _compare(model, SpecSettings(mode="spd", k=8, ngram_tokens=8), monkeypatch, n_batch=4, rounds=12)


def test_a_draft_ends_after_end_of_text(period_is_eos, monkeypatch):
    with Model(period_is_eos) as model:
        assert _compare(model, SpecSettings(mode="spd", k=8), monkeypatch, rounds=16, seed=3) > 0


def test_python_steps_where_the_library_cannot(draft_path):
    """A logit bias, a longer n-gram than the library looks up, or no room left in the cache."""
    with Model(draft_path) as model, Context(model, n_ctx=64, n_threads=1) as ctx:
        committed = model.tokenize(PROMPT)
        spec = SpecSettings(mode="spd", k=4)
        drafts = DraftModel(ctx, model.n_vocab)
        drafts.start(committed)
        assert drafts.run(committed, 4, 0, spec, False) is not None
        long = SpecSettings(mode="spd", k=4, ngram_max=native.MAX_NGRAM + 1)
        drafts.start(committed)
        assert drafts.run(committed, 4, 0, long, False) is None
        drafts.start(committed)
        assert drafts.run(committed, 64, 0, spec, False) is None  # past n_ctx


@pytest.mark.parametrize("sampling", [GREEDY, SamplingSettings(temperature=0.8, seed=3)], ids=["greedy", "sampled"])
def test_spd_text_is_the_same_either_way(stories, draft_path, sampling):
    with Engine(ModelSettings(str(stories), n_ctx=256), ModelSettings(str(draft_path), n_ctx=256)) as engine:
        for spec in (SpecSettings(mode="spd", k=4), SpecSettings(mode="spd", k=6, p_min=0.5, ngram=False)):
            fast = engine.generate(PROMPT, spec=spec, sampling=sampling, max_tokens=96).run()
            with native.enabled(False):
                slow = engine.generate(PROMPT, spec=spec, sampling=sampling, max_tokens=96).run()
            assert fast.tokens == slow.tokens
            assert (fast.stats.n_drafted, fast.stats.n_exact) == (slow.stats.n_drafted, slow.stats.n_exact)


@pytest.mark.parametrize("alphabet", [2, 3, 8, 50])
def test_the_libraries_ngram_lookup_is_the_index(alphabet):
    """fly_ngram_match == ngram.Index.match: the same guess from the same place."""
    rng = np.random.default_rng(alphabet)
    for _ in range(300):
        tokens = rng.integers(0, alphabet, int(rng.integers(0, 40))).tolist()
        max_n, n_pred = int(rng.integers(1, 7)), int(rng.integers(1, 8))
        start, length = native.ngram_match(np.array(tokens, dtype=np.int32), max_n, n_pred)
        n, guess = ngram.Index(max_n).match(tokens, n_pred)
        assert guess == tokens[start:start + length] and (length > 0) == (n > 0), (tokens, max_n, n_pred)
        if guess:
            assert ngram.match(tokens, max_n, n_pred)[1] == guess

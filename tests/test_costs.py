"""The cost model: curves measured on a real context, cached per pair/settings/machine, scaled
by real rounds; and the one-line note when speculation was slower than the target alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fly_cpp import Engine, ModelSettings
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.kauto.calibrate import calibrate, measure, measure_deep
from fly_cpp.kauto.costcache import cache_key, cache_path
from fly_cpp.kauto.costs import MAX_PER_ROW, Costs, Curve, format_curve
from fly_cpp.kauto.worth import slower_note

MS = 1e-3


def test_curve_interpolates_and_extrapolates():
    c = Curve((1, 2, 4), (10 * MS, 14 * MS, 20 * MS))
    assert c(1) == 10 * MS and c(3) == pytest.approx(17 * MS) and c(6) == pytest.approx(26 * MS)
    assert c.as_dict() == {"1": 10.0, "2": 14.0, "4": 20.0}


def test_a_curve_prices_a_decode_by_the_context_it_attends_over():
    c = Curve((1, 4), (10 * MS, 20 * MS), depth=100, per_token=(0.01 * MS, 0.04 * MS))
    assert c(1) == 10 * MS and c(1, 100) == 10 * MS and c(1, 600) == pytest.approx(15 * MS)
    assert c(4, 1100) == pytest.approx(60 * MS) and c(2, 1100) == pytest.approx(40 / 3 * MS + 20 * MS)
    assert c(4, 0) == pytest.approx(16 * MS) and c(1, -10**6) == pytest.approx(2.5 * MS)  # never below a quarter
    costs = Costs(c, Curve((1,), (1 * MS,), depth=100, per_token=(0.002 * MS,)))
    assert costs.target(4) == pytest.approx(16 * MS)  # no depth said yet: an empty cache
    costs.at(1100)
    assert costs.target(4) == pytest.approx(60 * MS) and costs.draft(1) == pytest.approx(3 * MS)
    assert not costs.observe_target(1, 99 * MS) and costs.target_scale == 1.0  # the first decode is not warm
    assert costs.observe_target(1, 40 * MS)  # a warm one-row decode learns against the curve at this depth
    assert costs.target_scale == pytest.approx(0.9 + 0.1 * 2)
    assert Curve((1,), (5 * MS,))(1, 10**6) == 5 * MS  # measured at one depth only: depth is ignored


def test_costs_come_back_from_their_dict_with_their_scales():
    """``Costs.from_dict`` reads what ``as_dict`` writes (a bench record's pacing), to its rounding."""
    costs = Costs(Curve((1, 4), (10 * MS, 20 * MS), depth=100, per_token=(0.01 * MS, 0.04 * MS)),
                  Curve((1, 2), (1 * MS, 1.5 * MS), depth=90, per_token=(0.002 * MS, 0.003 * MS)),
                  scales=(1.25, 0.8, 1.1))
    costs.at(100)  # the curves' own depth: the scales alone
    assert costs.target(1) == pytest.approx(12.5 * MS) and costs.target(4) == pytest.approx(16 * MS)
    back = Costs.from_dict(costs.as_dict())
    for depth in (50, 100, 400):
        costs.at(depth)
        back.at(depth)
        for rows in (1, 3, 4, 9):
            assert back.target(rows) == pytest.approx(costs.target(rows), rel=1e-6)
            assert back.draft(rows) == pytest.approx(costs.draft(rows), rel=1e-6)
    alone = Costs(Curve((1,), (10 * MS,)), None)
    assert Costs.from_dict(alone.as_dict()).draft_curve is None


def test_measure_deep_measures_a_deeper_cache_and_leaves_it_as_it_was(stories):
    with Model(stories) as m, Context(m, n_ctx=256, n_threads=1) as ctx:
        ctx.decode(m.tokenize("Once upon a time"), logits="none")
        before = list(ctx.tokens)
        curve = measure_deep(ctx, (1, 2, 4), token=m.bos)
        assert ctx.tokens == before and curve.depth == len(before) and curve.rows == (1, 2, 4)
        assert len(curve.per_token) == 3 and all(s >= 0 for s in curve.per_token)


def test_measure_leaves_the_cache_as_it_was_and_never_decreases(stories):
    with Model(stories) as m, Context(m, n_ctx=256, n_threads=1) as ctx:
        ctx.decode(m.tokenize("Once upon a time"), logits="none")
        before = list(ctx.tokens)
        curve = measure(ctx, (1, 2, 4, 8), token=m.bos)
        assert ctx.tokens == before and curve.rows == (1, 2, 4, 8)
        assert all(a <= b for a, b in zip(curve.seconds, curve.seconds[1:])) and curve.seconds[0] > 0


def test_calibration_is_cached_by_pair_settings_and_machine(stories, stories_draft, tmp_path, monkeypatch):
    monkeypatch.setenv("FLY_CPP_CACHE", str(tmp_path))
    monkeypatch.delenv("FLY_CPP_COSTS", raising=False)
    monkeypatch.setattr("fly_cpp.kauto.costs.MAX_PER_ROW", float("inf"))  # a busy test machine must not keep it out of the cache
    t, d = ModelSettings(str(stories), n_ctx=256, n_threads=1), ModelSettings(str(stories_draft), n_threads=1)
    with Engine(t, d) as e:
        first = calibrate(e.target, t, e.draft_ctx, d, token=0)
        again = calibrate(e.target, t, e.draft_ctx, d, token=0)
    assert not first.cached and again.cached and again.target_curve == first.target_curve
    assert first.target_curve.per_token and first.draft_curve is not None and first.draft_curve.per_token
    assert (tmp_path / "costs.json").exists()
    assert cache_key(t, 1, d, 1) != cache_key(t, 2, d, 1)  # other threads: measured again
    assert cache_key(t, 1, d, 1) != cache_key(t, 1, None, 0)
    assert "target ms" in format_curve(first) and "at 1024 tokens of context" in format_curve(first, 1024)


def test_a_curve_cached_at_one_depth_only_is_measured_again(stories, tmp_path, monkeypatch):
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setattr("fly_cpp.kauto.costs.MAX_PER_ROW", float("inf"))
    t = ModelSettings(str(stories), n_ctx=256, n_threads=1)
    with Model(stories) as m, Context(m, n_ctx=256, n_threads=1) as ctx:
        key = cache_key(t, 1, None, 0)
        (tmp_path / "costs.json").write_text(json.dumps({key: {"target": {"rows": [1, 2], "seconds": [0.01, 0.02]},
                                                               "draft": None}}))
        costs = calibrate(ctx, t, None, None, token=0)
    assert not costs.cached and costs.target_curve.per_token
    assert "per_token" in json.loads((tmp_path / "costs.json").read_text())[key]["target"]


def test_costs_file_can_be_named(tmp_path, monkeypatch):
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "mine.json"))
    assert cache_path() == tmp_path / "mine.json"


def test_online_scale_follows_real_rounds():
    c = Costs(Curve((1, 4), (10 * MS, 20 * MS)), Curve((1,), (5 * MS,)))
    for _ in range(100):
        c.observe_target(1, 20 * MS)  # the machine got twice as slow
        c.observe_draft(1, 5 * MS)
        c.observe_host(1 * MS)
    assert c.target(1) == pytest.approx(20 * MS, rel=0.01) and c.target(4) == pytest.approx(40 * MS, rel=0.01)
    assert c.draft(1) == pytest.approx(5 * MS, rel=0.01) and c.host == pytest.approx(1 * MS)


def test_a_misjudged_single_decode_is_corrected_without_making_batches_dear():
    c = Costs(Curve((1, 2, 4), (72 * MS, 127 * MS, 140 * MS)), None)  # one row truly costs 98 ms
    for _ in range(60):
        c.observe_target(1, 98 * MS)
    assert c.target(1) == pytest.approx(98 * MS, rel=0.01)
    assert c.target(4) == pytest.approx(140 * MS * 98 / 72, rel=0.01)  # no batch seen: the one scale
    for _ in range(60):  # runs of each kind: the first decode of a run (a switch) teaches nothing
        c.observe_target(1, 98 * MS)
        c.observe_target(1, 98 * MS)
        c.observe_target(4, 140 * MS)
        c.observe_target(4, 140 * MS)
    assert c.target(1) == pytest.approx(98 * MS, rel=0.01) and c.target(4) == pytest.approx(140 * MS, rel=0.01)
    assert c.target(2) == pytest.approx(127 * MS, rel=0.01)
    assert c.as_dict()["batch_scale"] == pytest.approx(1.0, abs=0.01)


def test_only_warm_decodes_teach_and_one_off_costs_move_a_scale_a_little():
    c = Costs(Curve((1, 4), (2 * MS, 3 * MS)), Curve((1,), (1 * MS,)))
    assert not c.observe_target(4, 9 * MS)  # a batch after nothing: not warm
    assert not c.observe_target(1, 9 * MS)  # a single row after a batch: not warm
    assert c.target_scale == 1.0 and c.batch_scale is None
    assert c.observe_target(1, 100 * MS)  # warm, but a one-off: held to twice the scale
    assert c.target_scale == pytest.approx(1.1)
    c.observe_draft(1, 50 * MS)  # the draft model did not decode in the last round: not warm
    assert c.draft_scale == 1.0
    c.drafted(True)
    c.observe_draft(1, 0.1 * MS)  # held to half the scale
    assert c.draft_scale == pytest.approx(0.95)
    c.cold()  # a prompt was decoded: the next decodes are not warm
    assert not c.observe_target(1, 2 * MS)
    c.observe_draft(1, 50 * MS)  # nor the draft's
    assert c.draft_scale == pytest.approx(0.95)


def test_a_switch_of_kinds_is_priced_apart_and_charged_to_a_batch_after_one_row_decodes():
    """On a tiny model a one-row decode after a batch costs half again a warm one (llama.cpp
    sets its graph up anew): learned apart from the scales, and charged to a batch planned
    after one-row decodes, there and back."""
    c = Costs(Curve((1, 4), (0.12 * MS, 0.30 * MS)), None)
    c.observe_target(1, 0.12 * MS)  # after the prompt: not a switch
    assert c.switch == 0.0 and c.entering() == 0.0
    for _ in range(40):
        c.observe_target(1, 0.12 * MS)
        c.observe_target(4, 0.34 * MS)  # a batch after one-row decodes: 0.04 ms dear
        c.observe_target(1, 0.18 * MS)  # and back: 0.06 ms dear
    assert c.switch == pytest.approx(0.05 * MS, rel=0.1)
    assert c.entering() == pytest.approx(2 * c.switch)  # the last decode had one row
    c.observe_target(4, 0.34 * MS)
    assert c.entering() == 0.0  # a batch came last: the next one switches nothing
    c.observe_target(1, 50 * MS)  # a one-off held to one one-row decode
    assert c.switch < 0.05 * MS + 0.1 * c.target(1) + 1e-9
    assert c.target_scale == pytest.approx(1.0) and c.batch_scale is None  # no batch came after a batch


def test_slower_note_says_why_and_what_to_try():
    c = Costs(Curve((1, 2, 6), (34 * MS, 58 * MS, 133 * MS)), Curve((1,), (20 * MS,)))
    note = slower_note(14.0, 5.0, 3.0, c, auto=False)
    assert note is not None and "slower than the target alone" in note and "~29.4 tok/s" in note
    assert "0.59 of a target decode" in note and "verifying 6 rows costs 3.9 decodes" in note and "--k auto" in note
    assert slower_note(29.0, 5.0, 3.0, c, auto=False) is None  # as fast as the target: nothing to say
    assert "exploring" in (slower_note(14.0, 5.0, 3.0, c, auto=True) or "")


def test_k_auto_says_in_words_why_it_drafted_nothing(stories, stories_draft, tmp_path, monkeypatch):
    """Where k auto drafted nothing (a draft step as dear as a target decode: nothing pays), the
    note says so and why, in one line; a fixed k or the target mode say nothing of it."""
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(tmp_path / "evidence.json"))
    from fly_cpp import SamplingSettings, SpecSettings
    rows = (1, 2, 4, 8, 16, 32)
    dear = Costs(Curve(rows, tuple(1e-3 * r for r in rows)), Curve(rows, tuple(2e-3 * r for r in rows)))
    with Engine(*_pair(stories, stories_draft)) as e:
        e.control.use(dear)
        gen = e.generate("Once upon a time", spec=SpecSettings(mode="spd"), sampling=SamplingSettings(temperature=0),
                         max_tokens=32).run()
        note = e.slower_note(gen)
    assert gen.stats.n_drafted == 0
    assert note is not None and note.startswith("k auto drafted nothing: the target alone is fastest here")
    assert "ms a token, a draft step " in note and "docs/models.md" in note  # the prices as the live decodes set them


def test_the_slower_note_never_measures(stories, stories_draft, tmp_path, monkeypatch):
    """A note must not cost more than the answer: with a fixed k nothing calibrated, and with
    nothing cached the note stays silent instead of measuring (minutes on a large pair); k auto's
    cost model is the prior then, and nothing is measured or cached for it."""
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    from fly_cpp import SpecSettings
    with Engine(ModelSettings(str(stories), n_ctx=256, n_threads=1), ModelSettings(str(stories_draft), n_threads=1)) as e:
        gen = e.generate("Once upon a time", spec=SpecSettings(mode="spd", k=4), max_tokens=40).run()
        assert gen.stats.n_drafted > 0
        assert e.slower_note(gen) is None and not (tmp_path / "costs.json").exists()
        assert e.costs().prior and not (tmp_path / "costs.json").exists()  # k auto's start: nothing measured
        e.costs(refresh=True)  # measured and cached (``fly-cpp profile --recalibrate``)
        assert (tmp_path / "costs.json").exists()


def test_measure_makes_room_in_a_full_context(stories):
    with Model(stories) as m, Context(m, n_ctx=64, n_threads=1) as ctx:
        ctx.decode([m.bos] * 62, logits="none")
        curve = measure(ctx, (1, 2, 4, 8), token=m.bos)
        assert curve.rows == (1, 2, 4, 8) and len(ctx.tokens) == 56 and ctx.tokens == [m.bos] * 56


class _Clock:
    now = 0.0


class _TimedContext:
    """A context whose decodes take ``cost(rows)`` on a fake clock: its ``busy`` first passes
    over the sizes are bent as other work on the machine bends them (big batches 40x dearer)."""

    def __init__(self, one_row: float, busy: int) -> None:
        self.tokens: list[int] = []
        self.n_batch = self.n_ubatch = self.n_ctx = 512
        self.n_threads = 1
        self.rollback = "kv"
        self.one_row, self.busy, self.sizes_seen = one_row, busy, set()

    def decode(self, tokens, logits="last"):  # type: ignore[no-untyped-def]
        n = len(tokens)
        if n == 1 and max(self.sizes_seen, default=1) > 1:  # a new pass starts with one row
            self.busy -= 1
            self.sizes_seen.clear()
        self.sizes_seen.add(n)
        _Clock.now += self.one_row * (1 + 0.3 * (n - 1)) * (40 if self.busy > 0 and n >= 4 else 1)
        self.tokens += tokens

    def truncate(self, n: int) -> None:
        del self.tokens[n:]

    def checkpoint(self, pos: int | None = None, *, pin: bool = False) -> None:
        pass


@pytest.mark.parametrize("busy, cached", [(2, True), (99, False)])
def test_a_curve_bent_by_a_busy_machine_is_measured_again_and_never_cached(
        stories, tmp_path, monkeypatch, busy, cached):
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setattr("fly_cpp.kauto.calibrate.perf_counter", lambda: _Clock.now)
    t = ModelSettings(str(stories), n_ctx=256, n_threads=1)
    costs = calibrate(_TimedContext(10 * MS, busy), t, None, None, token=0)  # type: ignore[arg-type]
    assert costs.target_curve.plausible
    assert costs.target(8) <= MAX_PER_ROW * 8 * costs.target(1)
    if cached:  # a bent pass or two: the medians drop them, the curve is cached
        assert costs.target(8) == pytest.approx(10 * MS * (1 + 0.3 * 7))
    assert (cache_key(t, 1, None, 0) in (tmp_path / "costs.json").read_text()
            if (tmp_path / "costs.json").exists() else False) == cached
    assert not Curve((1, 4), (1 * MS, 40 * MS)).plausible and Curve((1, 4), (1 * MS, 5 * MS)).plausible


def test_a_cached_curve_the_live_decodes_contradict_is_rescaled_at_once():
    slow = Curve((1, 6), (4.9, 5.4))  # taken beside other work: batches look free
    c = Costs(slow, None, cached=True)
    for _ in range(4):  # the first decode after the prompt is not warm
        c.observe_target(1, 0.11)
    assert c.disagrees and c.target_scale == pytest.approx(0.11 / 4.9)  # at once, not a tenth a round
    fresh = Costs(slow, None, cached=False)  # a curve measured now is not second-guessed
    for _ in range(4):
        fresh.observe_target(1, 0.11)
    assert not fresh.disagrees and fresh.target_scale > 0.5
    near = Costs(Curve((1, 6), (0.1, 0.3)), None, cached=True)
    for s in (0.1, 0.12, 0.09, 0.11):  # within noise: the usual slow blend
        near.observe_target(1, s)
    assert not near.disagrees


def test_a_rescaled_curve_keeps_its_shape_by_kind_and_never_has_a_batch_below_one_row():
    c = Curve((1, 2, 4), (10 * MS, 14 * MS, 20 * MS), depth=8, per_token=(1e-6, 2e-6, 4e-6))
    s = c.scaled(0.5, 2.0)
    assert s.seconds == pytest.approx((5 * MS, 28 * MS, 40 * MS)) and s.per_token == pytest.approx((5e-7, 4e-6, 8e-6))
    assert c.scaled(3.0, 1.0).seconds == pytest.approx((30 * MS, 30 * MS, 30 * MS))  # batches held at one row's
    costs = Costs(c, Curve((1, 8), (1 * MS, 2 * MS)), cached=True)
    costs.at(8)
    for _ in range(4):
        costs.observe_target(1, 30 * MS)  # 3x the curve: the check sets the one-row scale at once
    assert costs.disagrees
    target, draft = costs.live()  # no batch seen: batches follow the one-row scale
    assert target(1) == pytest.approx(costs.target(1)) and target(4) == pytest.approx(costs.target(4))
    assert draft is not None and draft.seconds == pytest.approx((1 * MS, 2 * MS))


def test_a_batch_seen_before_the_one_row_check_settles_takes_its_own_live_price():
    """The sequence that dropped a contradicted curve under load: a batch decoded while the
    one-row check was still pending blended its scale from the stale one-row scale; when the
    check then set the one-row scale to the live ratio, the batch scale stayed 20x too dear."""
    c = Costs(Curve((1, 4), (20 * MS, 40 * MS)), None, cached=True)  # 20x too dear
    c.observe_target(1, 1 * MS, count=3)  # a run of one-row decodes: two warm, the check pending
    c.observe_target(2, 1.5 * MS)  # a switch: not warm
    c.observe_target(2, 1.5 * MS)  # its own check pending too: blended from the one-row scale
    assert c.batch_scale is not None and c.batch_scale > 0.5
    c.observe_target(1, 1 * MS)  # a switch
    c.observe_target(1, 1 * MS)  # the one-row check settles: 0.05
    assert c.disagrees and c.target_scale == pytest.approx(0.05)
    assert c.batch_scale == pytest.approx(1.5 / (20 + 20 / 3))  # its one live ratio (2 rows on the curve), not the stale blend
    target, _ = c.live()
    assert target.plausible and target(4) > target(1)


def test_a_cached_draft_curve_is_checked_by_its_first_warm_live_decodes():
    draft = Curve((1, 4), (30 * MS, 60 * MS))  # 3x too dear
    c = Costs(Curve((1, 4), (10 * MS, 20 * MS)), draft, cached=True)
    assert not c.draft_checked
    c.observe_draft(1, 10 * MS)  # not warm: the draft model did not decode in the last round
    assert not c.draft_checked and c.draft_scale == 1.0
    c.drafted(True)
    c.observe_draft(1, 10 * MS)
    c.observe_draft(1, 11 * MS)
    assert not c.disagrees and c.draft_scale > 0.8  # a tenth a decode until the check settles
    c.observe_draft(1, 9 * MS)
    assert c.draft_checked and c.disagrees and c.draft_scale == pytest.approx(1 / 3)  # at once
    assert c.live()[1] is not None and c.live()[1].seconds == pytest.approx((10 * MS, 20 * MS))
    fresh = Costs(Curve((1, 4), (10 * MS, 20 * MS)), draft)  # measured by this process: trusted
    assert fresh.draft_checked
    near = Costs(Curve((1, 4), (10 * MS, 20 * MS)), draft, cached=True)
    near.drafted(True)
    for _ in range(3):
        near.observe_draft(1, 25 * MS)  # within the tolerance: checked, learned as before
    assert near.draft_checked and not near.disagrees


def test_a_one_row_decode_follows_the_batches_scale_until_one_is_seen():
    c = Costs(Curve((1, 4), (10 * MS, 20 * MS)), None, cached=True)
    for _ in range(4):  # drafting every round, on a machine 1.6x slower than when the curve was measured
        c.observe_target(4, 32 * MS)
    assert c.disagrees and c.batch_scale == pytest.approx(1.6) and c.target_scale == pytest.approx(1.6)
    assert c.live()[0].seconds == pytest.approx((16 * MS, 32 * MS))  # cached with its shape, not batches alone dearer
    c.observe_target(1, 11 * MS)  # a switch: not warm
    c.observe_target(1, 11 * MS)  # the guess gives way to what is seen: its own first decodes, not a tenth a decode
    assert c.target_scale == pytest.approx(1.1) and c.batch_scale == pytest.approx(1.6)
    c.observe_target(1, 7 * MS)
    c.observe_target(1, 13 * MS)
    assert c.target_scale == pytest.approx(1.1)  # the median of the first three
    c.observe_target(1, 7 * MS)
    assert c.target_scale == pytest.approx(0.9 * 1.1 + 0.1 * 0.7)  # then the usual blend


def test_a_scale_set_far_from_the_curve_stays_where_the_live_decodes_put_it():
    c = Costs(Curve((1, 6), (4.9, 5.4)), None, cached=True)
    for _ in range(40):
        c.observe_target(1, 0.11)
    assert c.target_scale == pytest.approx(0.11 / 4.9)  # it once crept up to 0.2 (9x the live cost)


def _pair(stories, stories_draft):  # type: ignore[no-untyped-def]
    return ModelSettings(str(stories), n_ctx=256, n_threads=1), ModelSettings(str(stories_draft), n_threads=1)


def test_a_contradicted_calibration_is_cached_rescaled_and_the_next_process_measures_nothing(
        stories, stories_draft, tmp_path, monkeypatch):
    """A cached curve 20x too dear (taken beside other work) is contradicted by the live decodes:
    it is cached again as they priced it, noted as rescaled, and a fresh engine starts from it
    without measuring (a calibration there lands inside a user's answer)."""
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(tmp_path / "evidence.json"))
    from fly_cpp import SpecSettings
    from fly_cpp.kauto.costcache import load, store
    with Engine(*_pair(stories, stories_draft)) as e:
        key, real = e.control.cost_key(), e.costs()
        bent = {"target": _entry(real.target_curve, 20.0), "draft": _entry(real.draft_curve, 10.0),  # far past any load
                "measured": "2026-01-01 00:00 UTC, load 7.00 on 2 cores"}
    store(key, bent)
    with Engine(*_pair(stories, stories_draft)) as e:
        gen = e.generate("Once upon a time", spec=SpecSettings(mode="spd"), max_tokens=96).run()
        costs = gen.stats.pacing["costs"]
    assert costs["disagrees"] and not costs["cached"]
    entry = load()[key]
    assert entry["measured"] == costs["measured"]
    assert entry["measured"].startswith("rescaled from live decodes ") and entry["measured"].endswith(
        "; calibrated 2026-01-01 00:00 UTC, load 7.00 on 2 cores")
    was = Curve(tuple(bent["target"]["rows"]), tuple(bent["target"]["seconds"]))
    batch = costs["batch_scale"] if costs["batch_scale"] is not None else costs["target_scale"]
    rounding = 0.0006 / min(costs["target_scale"], batch)  # the stats keep scales to 3 decimals
    assert entry["target"]["seconds"] == pytest.approx(was.scaled(costs["target_scale"], batch).seconds, rel=rounding)
    assert entry["target"]["seconds"][0] < was.seconds[0] / 1.5  # what the check found: the curve too dear
    import fly_cpp.kauto.calibrate as cal
    monkeypatch.setattr(cal, "measure_deep", lambda *a, **k: pytest.fail("measured again"))
    with Engine(*_pair(stories, stories_draft)) as e:
        again = e.generate("Once upon a time", spec=SpecSettings(mode="spd"), max_tokens=96).run()
        assert again.stats.pacing["costs"]["cached"] or again.stats.pacing["costs"]["disagrees"]
    assert load()[key]["measured"].endswith("; calibrated 2026-01-01 00:00 UTC, load 7.00 on 2 cores")  # said once


def test_a_draft_curve_cached_too_dear_is_checked_once_and_noted(stories, stories_draft, tmp_path, monkeypatch):
    """A draft curve cached 10x too dear, by which no round could pay to draft: while no live
    decode has checked it, its price is drawn widely (``belief.UNCHECKED_SPREAD``), so a draw
    cheap enough explores and times the draft's steps; its scale jumps to the live price (under
    half the cached one even where a busy machine makes the live steps 3x dearer than the
    calibration found), the entry is cached again as they priced it and says so; the next
    process trusts it: its price is drawn no more. (Planning is left unpriced, as beside the
    decodes of a pair worth drafting with: on this tiny pair a plan costs more than a decode, so
    no round could pay to draft whatever the draft's price, ``Costs.planning``.)"""
    monkeypatch.setattr(Costs, "observe_planning", lambda self, seconds: None)
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(tmp_path / "evidence.json"))
    from fly_cpp import SamplingSettings, SpecSettings
    from fly_cpp.kauto.costcache import load, store
    with Engine(*_pair(stories, stories_draft)) as e:
        key, real = e.control.cost_key(), e.costs(refresh=True)
    one = real.draft_curve.seconds[0] * 10  # batches dearer by a plausible shape: the rescaled curve is fit to cache
    draft = {"rows": [1, 2, 4, 8], "seconds": [one, 1.5 * one, 2.5 * one, 4.5 * one], "depth": 0, "per_token": [0.0] * 4}
    store(key, {"target": _entry(real.target_curve, 1.0), "draft": draft, "measured": "then"})
    greedy = SamplingSettings(temperature=0)
    with Engine(*_pair(stories, stories_draft)) as e:
        for _ in range(20):  # a draw is by chance: a few answers' rounds (a few in a hundred draw that cheap)
            gen = e.generate("Once upon a time", spec=SpecSettings(mode="spd"), sampling=greedy, max_tokens=64).run()
            if load()[key].get("draft_checked"):
                break
    costs = gen.stats.pacing["costs"]
    assert gen.stats.pacing["plans"]["explore"] + gen.stats.pacing["plans"]["draft"] >= 1 and costs["draft_scale"] < 0.5
    entry = load()[key]
    assert entry["draft_checked"] is True and entry["draft"]["seconds"][0] < 5 * real.draft_curve.seconds[0]
    with Engine(*_pair(stories, stories_draft)) as e:
        again = e.generate("Once upon a time", spec=SpecSettings(mode="spd"), sampling=greedy, max_tokens=64).run()
    assert again.stats.pacing["costs"]["draft_checked"]


def test_a_draft_curve_the_live_decodes_confirm_is_noted_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    from fly_cpp.kauto.costcache import load, note, store
    note("absent", draft_checked=True)  # no entry: nothing
    assert load() == {}
    store("k", {"target": {}, "draft": None, "measured": "then"})
    note("k", draft_checked=True)
    assert load()["k"] == {"target": {}, "draft": None, "measured": "then", "draft_checked": True}
    c = Costs(Curve((1, 4), (10 * MS, 20 * MS)), Curve((1, 4), (3 * MS, 6 * MS)), cached=True, draft_checked=True)
    c.drafted(True)
    for _ in range(3):
        c.observe_draft(1, 1 * MS)  # trusted: no check, learned a tenth a decode
    assert c.draft_checked and not c.draft_checked_live and not c.disagrees and c.draft_scale > 0.8


def _entry(curve: Curve, times: float) -> dict[str, object]:
    return {"rows": list(curve.rows), "seconds": [s * times for s in curve.seconds], "depth": curve.depth,
            "per_token": [p * times for p in curve.per_token]}


def test_a_contradicted_curve_whose_rescaling_is_unfit_to_cache_is_dropped(stories, tmp_path, monkeypatch):
    """A flat curve (one-row timings inflated by other work) that only one-row decodes checked
    stays flat when rescaled: on a CPU it is not cached, and the next process measures again."""
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    from fly_cpp.kauto.calibrate import store_live
    from fly_cpp.kauto.costcache import load, store
    store("k", {"target": {}, "draft": None})
    c = Costs(Curve((1, 6), (4.9, 5.4)), None, cached=True, measured="then")
    for _ in range(4):
        c.observe_target(1, 0.11)
    t = ModelSettings(str(stories), n_threads=1)
    assert store_live("k", c, t, None) is None and "k" not in load()
    c = Costs(Curve((1, 6), (0.3, 0.9)), None, cached=True, measured="then")
    for _ in range(4):
        c.observe_target(1, 0.11)
    note = store_live("k", c, t, None)
    assert note is not None and note.endswith("; calibrated then") and load()["k"]["measured"] == note


class _FlatContext(_TimedContext):
    """Every decode costs about one row's time, whatever its size: the one-row timings inflated
    by other work on the machine, so that batches look free."""

    def decode(self, tokens, logits="last"):  # type: ignore[no-untyped-def]
        _Clock.now += self.one_row * (1 + 0.01 * (len(tokens) - 1))
        self.tokens += tokens


@pytest.mark.parametrize("gpu_layers, cached", [(0, False), (99, True)])
def test_a_curve_whose_batches_cost_a_single_decode_is_not_cached_on_a_cpu(stories, tmp_path, monkeypatch,
                                                                           gpu_layers, cached):
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setattr("fly_cpp.kauto.calibrate.perf_counter", lambda: _Clock.now)
    t = ModelSettings(str(stories), n_ctx=256, n_threads=1, n_gpu_layers=gpu_layers)
    calibrate(_FlatContext(10 * MS, 0), t, None, None, token=0)  # type: ignore[arg-type]
    from fly_cpp.kauto.calibrate import flat
    assert flat(Curve((1, 6), (4.9, 5.4))) and not flat(Curve((1, 2, 4), (1 * MS, 1.3 * MS, 2 * MS)))
    assert (tmp_path / "costs.json").exists() == cached  # on a GPU batches can cost what one row does


def _hog() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_a_calibration_beside_a_cpu_hog_is_refused_or_checked_by_the_next_run(stories, stories_draft, tmp_path,
                                                                              monkeypatch):
    """Whatever the hog did to the timings, the decision is consistent: a curve it bent is not
    cached, or, cached, the next (idle) process's first live decodes either agree with it or
    mark it for measuring again, dropping it from the cache."""
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(tmp_path / "evidence.json"))
    from fly_cpp import SpecSettings
    from fly_cpp.kauto.costcache import load
    settings = (ModelSettings(str(stories), n_ctx=256, n_threads=1), ModelSettings(str(stories_draft), n_threads=1))
    hogs = [_hog() for _ in range(2)]
    try:
        with Engine(*settings) as e:
            measured = e.costs(refresh=True)
            key = e.control.cost_key()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert not measured.cached and "load" in measured.measured
    if key not in load():  # refused: bent beyond what a CPU does
        return
    with Engine(*settings) as e:
        gen = e.generate("Once upon a time", spec=SpecSettings(mode="spd"), max_tokens=48).run()
        costs = gen.stats.pacing["costs"]
        # agreed with (still cached), or rescaled at once and cached rescaled (or dropped when unfit)
        assert costs["disagrees"] == (not costs["cached"])
        assert not costs["disagrees"] or key not in load() or load()[key]["measured"].startswith("rescaled")


def test_a_busy_machine_does_not_make_calibration_retry_for_minutes(stories, tmp_path, monkeypatch):
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setattr("fly_cpp.kauto.calibrate.perf_counter", lambda: _Clock.now)
    tries: list[int] = []
    import fly_cpp.kauto.calibrate as cal
    real = cal.measure_deep
    monkeypatch.setattr(cal, "measure_deep", lambda *a, **k: tries.append(1) or real(*a, **k))
    t = ModelSettings(str(stories), n_ctx=256, n_threads=1)
    calibrate(_TimedContext(1.0, 99), t, None, None, token=0)  # type: ignore[arg-type]  # 1 s a row, always bent
    assert len(tries) == 1 and not (tmp_path / "costs.json").exists()
    tries.clear()
    calibrate(_TimedContext(1e-5, 99), t, None, None, token=0)  # type: ignore[arg-type]  # quick: tried again
    assert len(tries) == cal.MEASURE_TRIES


def test_micro_batches_of_one_row_time_three_sizes_and_price_the_rest_linearly(stories) -> None:
    """With n_ubatch 1 a batch is that many one-row decodes: the calibration times 1-3 rows
    (not up to 17, seconds a pass on a big model) and the curve goes on from their slope."""
    from fly_cpp.kauto.calibrate import TARGET_ROWS, timed_sizes

    assert timed_sizes(TARGET_ROWS, 1) == (1, 2, 3)
    assert timed_sizes(TARGET_ROWS, 4) == (1, 2, 3, 4, 6, 8)
    assert timed_sizes(TARGET_ROWS, 512) == TARGET_ROWS
    m = Model(str(stories))
    with Context(m, n_ctx=256, n_threads=1, n_ubatch=1) as ctx:
        curve = measure(ctx, TARGET_ROWS, token=m.bos)
    assert curve.rows == (1, 2, 3)
    slope = curve(3) - curve(2)
    assert curve(8) == pytest.approx(curve(3) + 5 * slope)


def test_batch_sizes_past_what_a_calibration_times_share_its_cache_entry(stories, stories_draft) -> None:
    """A decode of at most LARGEST_TIMED rows runs alike under any larger n_batch or n_ubatch:
    ``--n-batch 1000000000`` uses the pair's calibration instead of measuring anew."""
    def key(**changes: int) -> str:
        return cache_key(ModelSettings(str(stories), **changes), 1, ModelSettings(str(stories_draft)), 1)

    assert key() == key(n_batch=10**9) == key(n_batch=10**9, n_ubatch=4096)
    assert key(n_ubatch=1) != key() and key(n_batch=16) != key()

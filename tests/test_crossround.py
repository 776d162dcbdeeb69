"""The cross-round window's memory across rounds (no model needed)."""

from __future__ import annotations

from fly_cpp.rounds.accept import Verdict
from fly_cpp.config import SpecSettings
from fly_cpp.rounds.crossround import Window
from fly_cpp.rounds.rules import RoundRules


def window(**spec) -> Window:
    return Window(RoundRules.of(SpecSettings(mode="fly", cross_round=True, **spec)))


def test_enabled_only_where_fly_can_loosen():
    assert window().enabled
    assert not Window(RoundRules.of(SpecSettings(mode="spd", cross_round=True))).enabled
    assert not window(window=0).enabled and not window(entropy_threshold=float("inf")).enabled
    off = Window(RoundRules.of(SpecSettings(mode="fly", cross_round=False)))
    assert not off.enabled and off.max_left() is None


def test_on_by_default_under_the_guarded_rule_only():
    assert Window(RoundRules.of(SpecSettings(mode="fly"))).enabled
    assert not Window(RoundRules.of(SpecSettings(mode="fly", fly_rule="paper"))).enabled  # the published rule, bit for bit
    assert Window(RoundRules.of(SpecSettings(mode="fly", fly_rule="paper", cross_round=True))).enabled


def test_hold_then_confirm():
    w = window()
    kept = Verdict(accepted=5, loose=(), next_token=6, gate_rejected=False, provisional=2, window_left=3)
    assert not w.observe(kept, n_drafted=5, base=10, chosen=[1, 2, 3, 4, 5, 6], round=1)
    assert w.pending is not None and (w.pending.pos, w.pending.correction, w.left) == (12, 3, 3)
    assert not w.holds(11) and w.holds(12) and w.holds(20) and w.is_pending(12) and not w.is_pending(13)
    still_open = Verdict(accepted=2, loose=(), next_token=9, gate_rejected=False, window_left=1)
    assert not w.observe(still_open, n_drafted=2, base=16, chosen=None, round=2) and w.left == 1
    done = Verdict(accepted=4, loose=(), next_token=9, gate_rejected=False, confirmed=True)
    assert w.observe(done, n_drafted=4, base=19, chosen=None, round=3)
    assert w.pending is None and w.left == 0 and not w.holds(12)


def test_refute_hands_back_the_pending_mismatch():
    w = window()
    w.observe(Verdict(5, (), 6, False, provisional=4, window_left=5), 5, 0, [1, 2, 3, 4, 7, 6], 1)
    pending = w.refute()
    assert (pending.pos, pending.correction, pending.round) == (4, 7, 1) and w.pending is None


def test_max_left_follows_the_drafts_running_agreement():
    assert window(cross_round_confidence=0.5).max_left() is None  # guarded: every window is finished
    w = window(cross_round_confidence=0.5, fly_rule="paper")
    assert w.max_left() == 1  # no evidence yet: p = 1/2
    for _ in range(20):  # 20 rounds of 8 exact matches
        w.observe(Verdict(8, (), 0, False), 8, 0, None, 1)
    assert w.max_left() >= 10
    assert window(cross_round_confidence=0.0, fly_rule="paper").max_left() is None  # keep every tail mismatch

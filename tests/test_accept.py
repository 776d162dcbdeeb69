"""The accept rule on hand-built tables (no model needed), in-round and with the cross-round
window (holding a tail mismatch, confirming, refuting)."""

import math

import numpy as np
import pytest

from fly_cpp.accept import AcceptPolicy, entropy_needed, judge, window_ok

FLY = AcceptPolicy(window=6, entropy_threshold=0.3)
HIGH, LOW = 1.0, 0.1  # entropies: gate open / gate closed


def run(drafted, target, entropy, policy=FLY, alt=None):
    return judge(np.array(drafted), np.array(target), None if entropy is None else np.array(entropy, float),
                  policy, None if alt is None else np.array(alt))


def test_all_exact_takes_the_bonus():
    v = run([1, 2, 3], [1, 2, 3, 9], [LOW] * 3)
    assert (v.accepted, v.loose, v.next_token, v.gate_rejected) == (3, (), 9, False)


def test_first_mismatch_is_corrected_without_loosening():
    v = run([1, 2, 3], [5, 2, 3, 9], [LOW] * 3, AcceptPolicy.exact())
    assert (v.accepted, v.next_token) == (0, 5)


def test_loose_accept_needs_the_whole_window_of_exact_matches():
    # k=8, mismatch at 0, then 5 exact matches (positions 1..5): window of 6 satisfied
    drafted = [7, 1, 2, 3, 4, 5, 6, 8]
    target = [0, 1, 2, 3, 4, 5, 6, 8, 9]
    v = run(drafted, target, [HIGH] * 8)
    assert v.accepted == 8 and v.loose == (0,) and v.next_token == 9 and v.n_exact == 7


def test_window_edge_at_the_end_of_the_draft():
    # W=6 and k=8: only positions 0 and 1 can be loosened (i + W < k).
    base = list(range(10, 18))
    for i in range(8):
        drafted = list(base)
        drafted[i] = 99
        target = base + [50]
        v = run(drafted, target, [HIGH] * 8)
        if i <= 1:
            assert v.accepted == 8 and v.loose == (i,), i
        else:
            assert v.accepted == i and v.loose == () and v.next_token == base[i], i


def test_authors_k15_only_positions_1_to_9_can_be_loose():
    ok = [bool(window_ok(np.array([j != i for j in range(15)]), 6)[i]) for i in range(15)]
    assert [i + 1 for i, x in enumerate(ok) if x] == list(range(1, 10))


def test_gate_boundary_is_inclusive():
    drafted = [7, 1, 2, 3, 4, 5, 6, 8]
    target = [0, 1, 2, 3, 4, 5, 6, 8, 9]
    at = run(drafted, target, [0.3] + [LOW] * 7)
    below = run(drafted, target, [np.nextafter(0.3, 0)] + [LOW] * 7)
    assert at.accepted == 8 and at.loose == (0,)
    assert below.accepted == 0 and below.next_token == 0 and below.gate_rejected


def test_mismatch_followed_by_another_mismatch_inside_the_window():
    # second mismatch at 3 kills the first (window judged on raw exact indicators), even with the gate open
    drafted = [7, 1, 2, 8, 4, 5, 6, 7, 8, 9, 10, 11]
    target = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    v = run(drafted, target, [HIGH] * 12)
    assert v.accepted == 0 and v.next_token == 0 and not v.gate_rejected


def test_two_loose_accepts_need_to_be_a_window_apart():
    drafted = [7, 1, 2, 3, 4, 5, 8, 7, 8, 9, 10, 11, 12, 13]
    target = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    v = run(drafted, target, [HIGH] * 14)
    assert v.accepted == 14 and v.loose == (0, 6) and v.next_token == 14


def test_bonus_after_a_loose_accept_and_correction_after_partial():
    drafted = [1, 7, 3, 4, 5, 6, 7, 9, 9]
    target = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    v = run(drafted, target, [HIGH] * 9)
    # mismatch at 1 loosened (2..6 exact); mismatch at 7 cannot be (7 + 6 >= 9): correction 8
    assert v.accepted == 7 and v.loose == (1,) and v.next_token == 8


def test_window_one_keeps_every_gated_mismatch_but_the_last():
    p = AcceptPolicy(window=1, entropy_threshold=0.3)
    v = run([5, 6, 7], [1, 2, 3, 4], [HIGH, HIGH, HIGH], p)
    assert v.accepted == 2 and v.loose == (0, 1) and v.next_token == 3


def test_second_sample_counts_as_exact():
    v = run([1, 2, 3], [1, 5, 6, 9], [LOW] * 3, alt=[0, 2, 3])
    assert v.accepted == 3 and v.loose == () and v.next_token == 9


def test_empty_draft_emits_the_target_token():
    v = run([], [42], [])
    assert (v.accepted, v.next_token) == (0, 42)


@pytest.mark.parametrize("seed", range(200))
def test_properties_on_random_rounds(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(0, 16))
    target = rng.integers(0, 4, m + 1)
    drafted = np.where(rng.random(m) < 0.8, target[:m], rng.integers(0, 4, m))
    entropy = rng.random(m)
    window = int(rng.integers(1, 8))
    exact = run(drafted, target, entropy, AcceptPolicy.exact())
    inf_gate = run(drafted, target, entropy, AcceptPolicy(window, math.inf))
    loose = run(drafted, target, entropy, AcceptPolicy(window, 0.5))
    looser = run(drafted, target, entropy, AcceptPolicy(window, 0.2))
    assert inf_gate == exact  # gate at infinity is exact matching
    assert exact.accepted <= loose.accepted <= looser.accepted  # lower threshold never keeps less
    assert len(loose.loose) <= len(looser.loose)
    # entropies outside the needed positions never matter
    need = entropy_needed(drafted, target, AcceptPolicy(window, 0.5))
    scrambled = np.where(need, entropy, rng.random(m))
    assert run(drafted, target, scrambled, AcceptPolicy(window, 0.5)) == loose


# -- the cross-round window ------------------------------------------------------------------

W6 = FLY


def j(drafted, target, entropy, left=0, policy=W6, cross=True):
    return judge(np.array(drafted), np.array(target), np.array(entropy, float), policy,
                 cross_round=cross, window_left=left)


def test_tail_mismatch_is_kept_provisionally():
    # k=5, W=6: a mismatch at 2 cannot be judged inside the draft (in-round: rejected)
    v = j([1, 2, 9, 4, 5], [1, 2, 3, 4, 5, 6], [HIGH] * 5)
    assert (v.accepted, v.provisional, v.window_left, v.next_token, v.loose) == (5, 2, 3, 6, ())
    assert v.n_exact == 4
    inround = j([1, 2, 9, 4, 5], [1, 2, 3, 4, 5, 6], [HIGH] * 5, cross=False)
    assert (inround.accepted, inround.next_token, inround.provisional) == (2, 3, None)


def test_tail_mismatch_needs_the_gate_and_only_exact_matches_after_it():
    assert j([1, 2, 9, 4, 5], [1, 2, 3, 4, 5, 6], [HIGH, HIGH, LOW, HIGH, HIGH]).accepted == 2
    assert j([1, 2, 9, 4, 5], [1, 2, 3, 4, 5, 6], [HIGH, HIGH, LOW, HIGH, HIGH]).gate_rejected
    v = j([1, 2, 9, 4, 7], [1, 2, 3, 4, 5, 6], [HIGH] * 5)  # second mismatch kills it
    assert (v.accepted, v.provisional, v.next_token) == (2, None, 3)


def test_window_that_ends_exactly_at_the_draft_end_is_judged_at_once():
    # mismatch at 0 with 5 exact matches after it in a draft of 6: the whole window is inside
    v = j([9, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6], [HIGH] * 6)
    assert (v.accepted, v.loose, v.provisional, v.next_token) == (6, (0,), None, 6)


def test_provisional_only_when_the_window_left_is_short_enough():
    v = judge(np.array([1, 2, 9, 4, 5]), np.array([1, 2, 3, 4, 5, 6]), np.full(5, HIGH), W6, cross_round=True,
              max_left=2)
    assert (v.accepted, v.provisional, v.next_token) == (2, None, 3)  # needs 3 more: not kept
    v = judge(np.array([1, 2, 9, 4, 5]), np.array([1, 2, 3, 4, 5, 6]), np.full(5, HIGH), W6, cross_round=True,
              max_left=3)
    assert (v.accepted, v.provisional, v.window_left) == (5, 2, 3)


def test_pending_window_confirmed_then_rest_judged_normally():
    # 3 exact matches still needed; they come, then a later mismatch is corrected
    v = j([1, 2, 3, 8, 5, 6, 7, 8, 9, 10, 11, 12], list(range(1, 14)), [LOW] * 12, left=3)
    assert v.confirmed and v.refuted_at is None and v.accepted == 3 and v.next_token == 4


def test_pending_window_refuted_by_a_mismatch():
    v = j([1, 7, 3, 4], [1, 2, 3, 4, 5], [HIGH] * 4, left=3)
    assert v.refuted_at == 1 and not v.confirmed


def test_pending_window_stays_open_on_a_short_all_exact_draft():
    v = j([1, 2], [1, 2, 3], [LOW] * 2, left=4)
    assert (v.accepted, v.window_left, v.next_token, v.confirmed) == (2, 2, 3, False)


def test_mismatch_right_after_confirmation_can_itself_be_provisional():
    v = j([1, 2, 9, 4], [1, 2, 3, 4, 5], [HIGH] * 4, left=2)
    assert v.confirmed and v.provisional == 2 and v.window_left == 4


@pytest.mark.parametrize("seed", range(300))
def test_same_decisions_where_the_window_fits(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(0, 16))
    target = rng.integers(0, 3, m + 1)
    drafted = np.where(rng.random(m) < 0.85, target[:m], rng.integers(0, 3, m))
    entropy = rng.random(m)
    policy = AcceptPolicy(int(rng.integers(1, 8)), 0.4)
    inround = judge(drafted, target, entropy, policy)
    cross = judge(drafted, target, entropy, policy, cross_round=True)
    n = inround.accepted
    fits = n == m or n + policy.window < m or not (drafted[n + 1:] == target[n + 1:m]).all()
    if fits:  # the stopping mismatch was judged inside the draft: same verdict
        assert cross == inround
    else:
        assert cross.accepted >= inround.accepted and cross.loose[: len(inround.loose)] == inround.loose
    need = entropy_needed(drafted, target, policy, cross_round=True)
    scrambled = np.where(need, entropy, rng.random(m))
    assert judge(drafted, target, scrambled, policy, cross_round=True) == cross

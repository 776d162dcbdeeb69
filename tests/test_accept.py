"""The accept rule on hand-built tables (no model needed), in-round and with the cross-round
window (holding a tail mismatch, confirming, refuting), and its safeguards."""

import math

import numpy as np
import pytest

from fly_cpp.rounds.accept import AcceptPolicy, Facts, admitted, entropy_needed, judge, window_ok

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


def random_round(rng):
    """A round of up to 15 drafted tokens over a 4-token vocabulary, mostly matching, with entropies."""
    m = int(rng.integers(0, 16))
    target = rng.integers(0, 4, m + 1)
    drafted = np.where(rng.random(m) < 0.8, target[:m], rng.integers(0, 4, m))
    return m, drafted, target, rng.random(m)


@pytest.mark.parametrize("seed", range(200))
def test_properties_on_random_rounds(seed):
    rng = np.random.default_rng(seed)
    m, drafted, target, entropy = random_round(rng)
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


# -- safeguards --------------------------------------------------------------------------------
# One gated, window-ok mismatch at position 0 (FLy keeps it), then 7 exact matches.
D = [7, 1, 2, 3, 4, 5, 6, 8]
T = [0, 1, 2, 3, 4, 5, 6, 8, 9]
E = [HIGH] * 8


def at0(**arrays):
    """Facts whose position 0 carries the given values (the rest are never read)."""
    out = {}
    for name, value in arrays.items():
        a = np.zeros(8, dtype=type(value))
        a[0] = value
        out[name] = a
    return Facts(**out)


def guarded(drafted=D, target=T, entropy=E, facts=None, **policy):
    return judge(np.array(drafted), np.array(target), np.array(entropy, float), AcceptPolicy(6, 0.3, **policy),
                 facts=facts)


KEPT, REFUSED = (8, (0,), 9, False), (0, (), 0, True)


def outcome(v):
    return v.accepted, v.loose, v.next_token, v.guard_rejected


@pytest.mark.parametrize("ratio, floor, result", [
    (0.6, 0.5, KEPT),      # p(d)/p(top) = 0.6 >= 0.5
    (0.5, 0.5, KEPT),      # the floor is inclusive
    (0.4, 0.5, REFUSED),   # the target finds the draft's token too unlikely
    (0.01, 0.0, KEPT),     # floor 0 = off
    (1.0, 1.0, KEPT),      # floor 1: only exact ties with the top token
])
def test_ratio_floor(ratio, floor, result):
    assert outcome(guarded(facts=at0(log_ratio=math.log(ratio)), min_ratio=floor)) == result


@pytest.mark.parametrize("rank, top_n, result", [
    (1, 2, KEPT),      # the target's second choice, top-2 allowed
    (2, 2, REFUSED),   # its third choice
    (0, 1, KEPT),      # d is a top token too (a tie the argmax broke the other way)
    (5, 0, KEPT),      # 0 = off
])
def test_rank_floor(rank, top_n, result):
    assert outcome(guarded(facts=at0(rank=rank), top_n=top_n)) == result


def test_both_floors_must_hold():
    facts = Facts(log_ratio=np.full(8, math.log(0.6)), rank=np.full(8, 3))
    assert outcome(guarded(facts=facts, min_ratio=0.5, top_n=2)) == REFUSED
    assert outcome(guarded(facts=facts, min_ratio=0.5, top_n=4)) == KEPT


@pytest.mark.parametrize("supported, result", [(True, KEPT), (False, REFUSED)])
def test_support_guard(supported, result):
    assert outcome(guarded(facts=at0(supported=supported), supported=True)) == result


@pytest.mark.parametrize("digits, loose_digits, result", [
    (True, False, REFUSED),   # "$80,000" drafted as "$130,000": a number is not a paraphrase
    (False, False, KEPT), (True, True, KEPT)])
def test_digits(digits, loose_digits, result):
    assert outcome(guarded(facts=at0(digits=digits), loose_digits=loose_digits)) == result


@pytest.mark.parametrize("in_code, loose_in_code, result", [
    (True, False, REFUSED), (False, False, KEPT), (True, True, KEPT)])
def test_code_blocks(in_code, loose_in_code, result):
    facts = at0(in_code=in_code)
    assert outcome(guarded(facts=facts, loose_in_code=loose_in_code)) == result


def test_a_guard_without_its_facts_keeps_exact_matches_only():
    for policy in ({"min_ratio": 0.5}, {"top_n": 2}, {"supported": True}, {"loose_in_code": False},
                   {"loose_digits": False}):
        assert outcome(guarded(facts=Facts(), **policy)) == REFUSED
        assert outcome(guarded(facts=None, **policy)) == REFUSED


def test_the_paper_rule_reads_no_facts():
    nothing = Facts(log_ratio=np.full(8, -50.0), rank=np.full(8, 999), supported=np.zeros(8, bool),
                    in_code=np.ones(8, bool), digits=np.ones(8, bool))
    paper = AcceptPolicy(6, 0.3)
    assert not paper.guarded and admitted(paper, None, 8).all()
    assert outcome(guarded(facts=nothing)) == KEPT
    assert guarded(facts=nothing) == guarded(facts=None) == run(D, T, E)


def test_gate_decides_before_the_guard():
    # the gate is closed: a gate rejection, not a safeguard one
    v = guarded(entropy=[LOW] * 8, facts=at0(log_ratio=math.log(0.1)), min_ratio=0.5)
    assert (v.accepted, v.gate_rejected, v.guard_rejected) == (0, True, False)


def test_guard_on_a_later_mismatch_after_a_loose_accept():
    # mismatches at 0 and 6 (a window apart): the guard refuses only the second
    drafted = [7, 1, 2, 3, 4, 5, 77, 8, 9, 10, 11, 12, 13]
    target = [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14]
    ratio = np.zeros(13)
    ratio[6] = math.log(0.1)
    v = guarded(drafted, target, [HIGH] * 13, Facts(log_ratio=ratio), min_ratio=0.5)
    assert (v.accepted, v.loose, v.next_token, v.guard_rejected) == (6, (0,), 6, True)


def test_guard_on_a_cross_round_tail():
    # a gated mismatch at 5 of 8 with exact matches after it: provisional, unless a guard refuses
    drafted, target = [1, 2, 3, 4, 5, 99, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9]
    facts = Facts(log_ratio=np.full(8, math.log(0.2)))
    policy = AcceptPolicy(6, 0.3, min_ratio=0.5)
    v = judge(np.array(drafted), np.array(target), np.array([HIGH] * 8), policy, cross_round=True, facts=facts)
    assert (v.accepted, v.provisional, v.next_token, v.guard_rejected) == (5, None, 6, True)
    ok = Facts(log_ratio=np.full(8, math.log(0.8)))
    v = judge(np.array(drafted), np.array(target), np.array([HIGH] * 8), policy, cross_round=True, facts=ok)
    assert (v.accepted, v.provisional, v.window_left) == (8, 5, 3)


def test_facts_are_sliced_after_a_confirmed_window():
    # a pending window needs 2 exact matches (positions 0, 1); then mismatches at 2 and 5, a
    # window (3) apart: the facts of position 5 refuse it, those of 2 let it through
    drafted = [1, 2, 9, 4, 5, 77, 7, 8, 9, 10, 11]
    target = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    ratio = np.zeros(11)
    ratio[5] = math.log(0.1)
    v = judge(np.array(drafted), np.array(target), np.array([HIGH] * 11), AcceptPolicy(3, 0.3, min_ratio=0.5),
              window_left=2, facts=Facts(log_ratio=ratio))
    assert v.confirmed and (v.accepted, v.loose, v.next_token, v.guard_rejected) == (5, (2,), 6, True)


GUARDS = [{"min_ratio": 0.5}, {"top_n": 2}, {"supported": True}, {"loose_in_code": False}, {"loose_digits": False},
          {"min_ratio": 0.3, "top_n": 3, "supported": True, "loose_in_code": False, "loose_digits": False}]


@pytest.mark.parametrize("seed", range(200))
def test_safeguards_never_add_loose_accepts(seed):
    rng = np.random.default_rng(seed)
    m, drafted, target, entropy = random_round(rng)
    facts = Facts(log_ratio=np.log(rng.random(m)), rank=rng.integers(0, 5, m), supported=rng.random(m) < 0.8,
                  in_code=rng.random(m) < 0.5, digits=rng.random(m) < 0.3)
    window, left = int(rng.integers(1, 8)), int(rng.integers(0, 3))
    for cross in (False, True):
        options = {"cross_round": cross, "window_left": left}
        plain = judge(drafted, target, entropy, AcceptPolicy(window, 0.3), **options)
        for guard in GUARDS:
            policy = AcceptPolicy(window, 0.3, **guard)
            v = judge(drafted, target, entropy, policy, facts=facts, **options)
            assert v.accepted <= plain.accepted and set(v.loose) <= set(plain.loose)
            assert (v.provisional is None or v.provisional == plain.provisional) and v.refuted_at == plain.refuted_at
            # window 0 or a gate at infinity: exact matching, whatever the safeguards
            for off in (AcceptPolicy(0, 0.3, **guard), AcceptPolicy(window, math.inf, **guard)):
                assert judge(drafted, target, entropy, off, facts=facts) == run(drafted, target, entropy,
                                                                                AcceptPolicy.exact())
            # facts outside the needed positions never matter
            need = entropy_needed(drafted, target, policy, cross_round=cross, window_left=left)
            noise = Facts(np.where(need, facts.log_ratio, np.log(rng.random(m))),
                          np.where(need, facts.rank, rng.integers(0, 5, m)),
                          np.where(need, facts.supported, rng.random(m) < 0.5),
                          np.where(need, facts.in_code, rng.random(m) < 0.5),
                          np.where(need, facts.digits, rng.random(m) < 0.5))
            assert judge(drafted, target, entropy, policy, facts=noise, **options) == v

"""The target's side of a round on hand-built logits (no model needed): greedy verdicts with
entropies computed only where they matter, the authors' two-draw rule, and sampled exact
matching against the target's own position-keyed draws."""

from __future__ import annotations

import numpy as np
import pytest

from fly_cpp.config import SamplingSettings, SpecSettings
from fly_cpp.rounds.request import Request
from fly_cpp.rounds.rules import RoundRules
from fly_cpp.rounds.verify import Verifier

V = 8
GREEDY = SamplingSettings(temperature=0)


def logits(best: list[int], flat: list[bool]) -> np.ndarray:
    """(len(best), V) rows peaked at ``best`` (flat rows: a near-tie, high entropy)."""
    rows = np.full((len(best), V), -5.0, dtype=np.float32)
    for i, (b, f) in enumerate(zip(best, flat)):
        rows[i, b] = 1.0 if f else 10.0
        if f:
            rows[i, (b + 1) % V] = 0.9
            rows[i, (b + 2) % V] = 0.8
    return rows


def verifier(mode: str = "fly", temperature: float = 0.0, **sampling) -> Verifier:
    """Greedy unless a temperature is given."""
    spec = SpecSettings(mode=mode, k=8, window=2, entropy_threshold=0.3, fly_rule="paper")  # window and gate alone
    return Verifier(Request((1,), RoundRules.of(spec), SamplingSettings(temperature=temperature, **sampling), 16, (), seed=0))


def test_greedy_exact_loose_and_gate():
    target = [1, 2, 3, 4, 5]
    # d_1 mismatches where the target is unsure, then the window (2) sees an exact match
    verdict, chosen = verifier()(logits(target, [False, True, False, False, False]), [1, 7, 3, 4], [0])
    assert list(chosen) == target and (verdict.accepted, verdict.loose, verdict.next_token) == (4, (1,), 5)
    # the same mismatch where the target is sure: the gate refuses it
    verdict, _ = verifier()(logits(target, [False] * 5), [1, 7, 3, 4], [0])
    assert (verdict.accepted, verdict.next_token, verdict.gate_rejected) == (1, 2, True)
    # spd never loosens
    verdict, _ = verifier("spd")(logits(target, [False, True, False, False, False]), [1, 7, 3, 4], [0])
    assert (verdict.accepted, verdict.loose, verdict.next_token) == (1, (), 2)


def test_sampled_rules():
    target = [1, 2, 3]
    rows = logits(target, [False] * 3)
    verdict, chosen = verifier("fly", temperature=0.5)(rows, [1, 2], [0])  # peaked rows: every draw is the top
    assert list(chosen) == target and (verdict.accepted, verdict.next_token) == (2, 3)
    verdict, chosen = verifier("spd", temperature=0.5)(rows, [1, 6], [0])
    assert list(chosen[:2]) == [1, 2] and (verdict.accepted, verdict.next_token) == (1, 2)


def test_a_draw_is_an_exact_sample_that_depends_only_on_its_place():
    sampler = verifier("spd", temperature=1.0).sampler
    ids, p = np.arange(3), np.array([0.6, 0.3, 0.1])
    counts = np.bincount([sampler.draw(ids, p, position) for position in range(20000)], minlength=3)
    assert counts / counts.sum() == pytest.approx(p, abs=0.015)  # over positions: distributed as p
    assert sampler.draw(ids, p, 7) == sampler.draw(ids, p, 7)  # the same place: the same token
    streams = [sampler.draw(ids, p, 7, stream) for stream in range(40)]
    assert len(set(streams)) > 1  # streams are independent draws


def test_sampled_spd_keeps_exactly_the_target_draws():
    """Whatever was drafted, what a sampled spd round emits is the target's own draws."""
    rows = logits([1, 2, 3, 4], [True] * 4)  # flat rows: draws vary
    v = verifier("spd", temperature=1.0)
    committed = [0]
    own = [v.sampler.sample(rows[i], committed + [None] * i) for i in range(4)]  # type: ignore[list-item]
    for drafted in ([own[0], own[1], own[2]], [own[0], 7, 5], [6, 6, 6]):
        verdict, chosen = v(rows, drafted, committed)
        emitted = [*drafted[: verdict.accepted], verdict.next_token]
        assert emitted == own[: len(emitted)]


def guarded(**spec) -> Verifier:
    """A greedy verifier under the guarded rule, with only the safeguards given (no ratio floor
    unless asked, and without the cross-round window, which also keeps loose accepts to the
    draft model's own tokens: ``own=True`` below); token 7 spells a code fence."""
    settings = SpecSettings(mode="fly", k=8, window=2, entropy_threshold=0.3, fly_rule="guarded",
                            **{"loose_min_ratio": 0.0, "cross_round": False, **spec})
    return Verifier(Request((1,), RoundRules.of(settings), GREEDY, 16, (), seed=0), lambda t: PIECES.get(t, b"a"))


PIECES = {7: b"```", 6: b" 80", 5: b"5"}  # token 7 spells a code fence; every other token "a"


def flat_row(top: int, second: int, ratio: float) -> np.ndarray:
    """A row whose top token is ``top`` and whose ``second`` has p(second)/p(top) = ratio."""
    row = np.full(V, -5.0, dtype=np.float32)
    row[top], row[second] = 1.0, 1.0 + np.log(ratio)
    return row


def test_guarded_facts_ratio_rank_and_support():
    target = [1, 2, 3, 4, 5]
    rows = logits(target, [False] * 5)
    rows[1] = flat_row(2, 6, 0.6)  # the draft's 6 is the target's second choice, 0.6 as likely
    drafted = [1, 6, 3, 4]
    v, _ = guarded(loose_min_ratio=0.5)(rows, drafted, [0])
    assert (v.accepted, v.loose) == (4, (1,))
    v, _ = guarded(loose_min_ratio=0.7)(rows, drafted, [0])
    assert (v.accepted, v.next_token, v.guard_rejected) == (1, 2, True)
    v, _ = guarded(loose_top_n=2)(rows, drafted, [0])
    assert v.loose == (1,)
    v, _ = guarded(loose_top_n=1)(rows, drafted, [0])
    assert v.guard_rejected
    facts = guarded(loose_min_ratio=0.5, loose_top_n=3).facts(rows, drafted, [0], np.array([1]), np.array(target))
    assert facts.log_ratio[1] == pytest.approx(np.log(0.6), abs=1e-6) and facts.rank[1] == 1
    assert facts.supported[1] and facts.in_code is None  # support: always checked by the guarded rule
    rows[1, 6] = -np.inf  # a token the target can never produce is never loosened
    rows[1, 3] = 0.9  # (keep the row unsure)
    v, _ = guarded()(rows, drafted, [0])
    assert (v.accepted, v.guard_rejected) == (1, True)
    paper = SpecSettings(mode="fly", k=8, window=2, entropy_threshold=0.3, fly_rule="paper")
    v, _ = Verifier(Request((1,), RoundRules.of(paper), GREEDY, 16, (), seed=0))(rows, drafted, [0])
    assert v.loose == (1,)  # the paper's rule keeps it


def test_guarded_sampling_refuses_what_the_sampler_cannot_draw():
    rows = logits([1, 2, 3, 4, 5], [False] * 5)
    rows[1] = flat_row(2, 6, 0.01)
    rows[1, 3] = 0.8  # open the gate
    spec = SpecSettings(mode="fly", k=8, window=2, entropy_threshold=0.3)
    for min_p, kept in ((0.05, False), (0.0, True)):
        v = Verifier(Request((1,), RoundRules.of(spec), SamplingSettings(temperature=0.01, top_k=0, top_p=1.0, min_p=min_p), 16, (),
                             seed=0))
        facts = v.facts(rows, [1, 6, 3, 4], [0], np.array([1]), np.array([1, 2, 3, 4, 5]))
        assert bool(facts.supported[1]) is kept


def test_guarded_code_blocks():
    target = [1, 2, 3, 4, 5]
    rows = logits(target, [False, True, False, False, False])
    # committed answer text "```" (token 7 after the one-token prompt): the mismatch at 1 is in code
    v, _ = guarded(loose_in_code=False)(rows, [1, 6, 3, 4], [0, 7])
    assert (v.accepted, v.guard_rejected) == (1, True)
    v, _ = guarded(loose_in_code=False)(rows, [1, 6, 3, 4], [0, 8])
    assert v.loose == (1,)
    v, _ = guarded(loose_in_code=True)(rows, [1, 6, 3, 4], [0, 7])
    assert v.loose == (1,)


def test_guarded_digits():
    target = [1, 2, 3, 4, 5]
    rows = logits(target, [False, True, False, False, False])
    # drafted 6 (" 80") where the target wanted 2 ("a"): a number, refused without loose_digits
    v, _ = guarded(loose_digits=False)(rows, [1, 6, 3, 4], [0])
    assert (v.accepted, v.guard_rejected) == (1, True)
    v, _ = guarded(loose_digits=True)(rows, [1, 6, 3, 4], [0])
    assert v.loose == (1,)
    rows = logits([1, 5, 3, 4, 5], [False, True, False, False, False])  # the target's own token is "5"
    v, _ = guarded(loose_digits=False)(rows, [1, 2, 3, 4], [0])
    assert (v.accepted, v.guard_rejected) == (1, True)

"""The target's side of a round on hand-built logits (no model needed): greedy verdicts with
entropies computed only where they matter, the authors' two-draw rule, lossless rejection
sampling."""

from __future__ import annotations

import numpy as np
import pytest

from fly_cpp.config import SamplingSettings, SpecSettings
from fly_cpp.request import Request
from fly_cpp.verify import Verifier, rejection_sample

V = 8


def logits(best: list[int], flat: list[bool]) -> np.ndarray:
    """(len(best), V) rows peaked at ``best`` (flat rows: a near-tie, high entropy)."""
    rows = np.full((len(best), V), -5.0, dtype=np.float32)
    for i, (b, f) in enumerate(zip(best, flat)):
        rows[i, b] = 1.0 if f else 10.0
        if f:
            rows[i, (b + 1) % V] = 0.9
            rows[i, (b + 2) % V] = 0.8
    return rows


def verifier(mode: str = "fly", **sampling) -> Verifier:
    spec = SpecSettings(mode=mode, k=8, window=2, entropy_threshold=0.3)
    return Verifier(Request((1,), spec, SamplingSettings(**sampling), 16, (), seed=0))


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
    assert chosen is None and (verdict.accepted, verdict.next_token) == (1, 2)


@pytest.mark.parametrize("draft", [0, 1])
def test_rejection_sampling_is_lossless(draft):
    """Over many rounds, the first emitted token is distributed as the target's own p."""
    p = np.array([0.6, 0.3, 0.1])
    ids = np.arange(3)
    sampler = verifier("spd", temperature=1.0).sampler
    counts = np.zeros(3)
    for _ in range(20000):
        n, token = rejection_sample([draft], lambda i: (ids, p), sampler)
        counts[draft if n == 1 else token] += 1
    assert counts / counts.sum() == pytest.approx(p, abs=0.015)

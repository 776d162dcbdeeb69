"""The accept rule of one round: a pure function over arrays.

The parts of a round, named once and used with these words everywhere in fly-cpp:

- **drafted**: the tokens d_1..d_m the drafter proposed (m <= k; a draft may end early).
- **target tokens**: t_1..t_{m+1}, the target's choice at each drafted position plus one
  extra position after the last drafted token, all from ONE batched target forward pass.
- **exact match**: d_i == t_i. (When sampling under the authors' rule, d_i equals either of two
  target samples; ``target_alt`` carries the second one.)
- **loosely accepted**: a mismatch kept because the entropy gate was open there (the target's
  top-3 entropy >= threshold, i.e. the target was unsure) and the target then agreed exactly
  with the draft over the rest of the deferred window.
- **accepted**: the longest prefix of drafted tokens that are exact matches or loosely
  accepted; its length n is the round's accepted count.
- **correction**: t_{n+1} when n < m. **bonus**: t_{m+1} when n == m. Either way a round emits
  d_1..d_n and then t_{n+1}: n + 1 tokens per target forward pass.
- **mean accepted length**: tokens emitted / rounds (the paper's MAT).

Window semantics: ``window`` W counts the mismatch itself (the authors' released code).
A mismatch at 0-based position i is window-ok when d_{i+1}..d_{i+W-1} are all exact matches
and, as in that code, i is not among the last W drafted positions (i + W < m). Window 0
switches loose acceptance off, which makes this exactly ordinary speculative decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class AcceptPolicy:
    """The two knobs of loose acceptance. ``AcceptPolicy.exact()`` is plain exact matching."""

    window: int = 6
    entropy_threshold: float = 0.3

    @staticmethod
    def exact() -> AcceptPolicy:
        return AcceptPolicy(window=0, entropy_threshold=math.inf)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one round keeps.

    accepted: n, how many drafted tokens are kept (a prefix of the draft).
    loose: 0-based positions among those n that were loosely accepted (mismatches kept).
    next_token: the correction (n < m) or the bonus token (n == m), emitted after the n.
    gate_rejected: the round stopped at a mismatch that the window would have kept but the
        entropy gate refused (the target was confident there).
    """

    accepted: int
    loose: tuple[int, ...]
    next_token: int
    gate_rejected: bool

    @property
    def n_exact(self) -> int:
        return self.accepted - len(self.loose)


def window_ok(exact: np.ndarray, window: int) -> np.ndarray:
    """Per position: would a mismatch here pass the deferred window? (bool, shape (m,))"""
    m = exact.shape[0]
    ok = np.zeros(m, dtype=bool)
    if window <= 0 or m <= window:
        return ok
    # hits[j] = exact matches among positions < j; exact[i+1 : i+window] are window-1 positions.
    hits = np.concatenate(([0], np.cumsum(exact, dtype=np.int64)))
    i = np.arange(m - window)  # i + window < m
    ok[i] = hits[i + window] - hits[i + 1] == window - 1
    return ok


def verify(
    drafted: np.ndarray,
    target: np.ndarray,
    entropy: np.ndarray | None,
    policy: AcceptPolicy,
    target_alt: np.ndarray | None = None,
) -> Verdict:
    """Judge one round.

    drafted: (m,) int token ids. target: (m+1,) int, the target's token at each drafted
    position and the bonus position. entropy: (m,) float top-3 entropy of the target's raw
    logits at each drafted position (may be None when the policy can never loosen).
    target_alt: optional (m,) int second target sample (authors' sampling rule).
    """
    drafted = np.asarray(drafted)
    target = np.asarray(target)
    m = drafted.shape[0]
    assert target.shape[0] == m + 1, "target needs one token per drafted position plus the bonus"
    exact = drafted == target[:m]
    if target_alt is not None:
        exact |= drafted == np.asarray(target_alt)[:m]

    may_loosen = policy.window >= 1 and math.isfinite(policy.entropy_threshold) and entropy is not None
    if may_loosen and not exact.all():
        windowed = window_ok(exact, policy.window)
        gate_open = np.asarray(entropy)[:m] >= policy.entropy_threshold
        keep = exact | (windowed & gate_open)
    else:
        windowed = gate_open = None
        keep = exact

    rejected = np.flatnonzero(~keep)
    n = int(rejected[0]) if rejected.size else m
    loose = tuple(int(i) for i in np.flatnonzero(~exact[:n]))
    gate_rejected = bool(windowed is not None and n < m and windowed[n] and not gate_open[n])
    return Verdict(accepted=n, loose=loose, next_token=int(target[n]), gate_rejected=gate_rejected)


def entropy_needed(drafted: np.ndarray, target: np.ndarray, policy: AcceptPolicy) -> np.ndarray:
    """Positions whose entropy can change the verdict: window-ok mismatches before the first
    mismatch that nothing could save. Lets callers compute entropies only there. (bool, (m,))"""
    drafted = np.asarray(drafted)
    m = drafted.shape[0]
    exact = drafted == np.asarray(target)[:m]
    if policy.window < 1 or not math.isfinite(policy.entropy_threshold) or exact.all():
        return np.zeros(m, dtype=bool)
    candidate = ~exact & window_ok(exact, policy.window)
    hopeless = np.flatnonzero(~exact & ~candidate)
    if hopeless.size:
        candidate[hopeless[0]:] = False
    return candidate

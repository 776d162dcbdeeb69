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
- **safeguards** (``AcceptPolicy`` beyond window and gate; all off in the paper's rule): further
  conditions a mismatch must meet before the window and gate may keep it, read from per-position
  ``Facts`` the verifier computes only where they can matter (``entropy_needed``):
  - *plausibility floor*: the drafted token is among the target's ``top_n`` most likely tokens
    there, and/or the target finds it at least ``min_ratio`` as likely as its most likely token:
    p(d)/p(top) = exp(logit_d - logit_top), no softmax needed.
  - *support guard* (vLLM's): the target could have produced the drafted token itself: a finite
    logit when greedy, a non-zero probability under its sampler (penalties, top-k, top-p, min-p)
    when sampling.
  - *code blocks*: with ``loose_in_code`` off, no mismatch inside a ``` code block of the
    answer is loosened (there a different token is a different program more often than not).
  - *numbers*: with ``loose_digits`` off, no mismatch where the drafted or the target's token
    holds a digit is loosened (a different digit is a different quantity, not a paraphrase).
  - *the draft model's own token* (``own_only``): only a drafted token that is the draft model's
    greedy choice where it stands may be loosened, never an n-gram guess. With it FLy's
    decisions depend on the text alone, not on how rounds were planned (``fly_cpp.rounds.loop``).
  A safeguard only ever removes loose accepts: every one is an extra AND in the rule.

Window semantics: ``window`` W counts the mismatch itself (the authors' released code).
A mismatch at 0-based position i is window-ok when d_{i+1}..d_{i+W-1} are all exact matches
and, as in that code, i is not among the last W drafted positions (i + W < m). Window 0
switches loose acceptance off, which makes this exactly ordinary speculative decoding.

Cross-round window (``judge(..., cross_round=True)``): a gated mismatch among the last W
drafted positions, followed only by exact matches, is kept **provisionally**: the round keeps
the whole draft and its bonus, and the next rounds complete the window with their own drafted
tokens (the bonus, being the target's own token, proves nothing and does not count). If a
drafted token mismatches before the window is complete the provisional segment is **refuted**:
the caller rolls back to the mismatch and puts the target's own token there, which is exactly
what the in-round rule would have produced. The gate is decided where the mismatch happened.
A window whose W-1 exact matches all lie inside the draft is judged at once, so this rule
also keeps a mismatch at i = m - W, which the released code's in-round rule leaves out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fly_cpp.config.policy import AcceptPolicy  # the rule's knobs, declared with the settings


@dataclass(frozen=True)
class Facts:
    """What the safeguards read, per drafted position: (m,) arrays, meaningful where
    ``entropy_needed`` marks a position (anything elsewhere); None where no safeguard needs it.
    A safeguard that is on but lacks its array loosens nothing.

    log_ratio: log p(d_i)/p(top_i) from the target's raw logits, logit(d_i) - max logit (<= 0).
    rank: how many tokens the target scores strictly above d_i (0: d_i is its top token).
    supported: the target's sampler gives d_i a non-zero probability (greedy: a finite logit).
    in_code: d_i starts inside a ``` code block of the answer.
    digits: d_i or the target's token t_i there holds a digit.
    own: d_i is the draft model's own greedy token there (not an n-gram guess).
    """

    log_ratio: np.ndarray | None = None
    rank: np.ndarray | None = None
    supported: np.ndarray | None = None
    in_code: np.ndarray | None = None
    digits: np.ndarray | None = None
    own: np.ndarray | None = None

    def tail(self, start: int) -> Facts:
        cut = lambda a: None if a is None else np.asarray(a)[start:]  # noqa: E731
        return Facts(cut(self.log_ratio), cut(self.rank), cut(self.supported), cut(self.in_code), cut(self.digits),
                     cut(self.own))


def admitted(policy: AcceptPolicy, facts: Facts | None, m: int) -> np.ndarray:
    """(m,) bool: positions where the safeguards let the window and gate decide."""
    ok = np.ones(m, dtype=bool)
    if not policy.guarded:
        return ok
    f = facts or Facts()

    def need(a: np.ndarray | None) -> np.ndarray | None:
        if a is None:
            ok[:] = False
            return None
        return np.asarray(a)[:m]

    if policy.top_n > 0 and (rank := need(f.rank)) is not None:
        ok &= rank < policy.top_n
    if policy.min_ratio > 0 and (ratio := need(f.log_ratio)) is not None:
        with np.errstate(invalid="ignore"):
            ok &= ratio >= math.log(policy.min_ratio)  # NaN never passes
    if policy.supported and (sup := need(f.supported)) is not None:
        ok &= sup.astype(bool)
    if not policy.loose_in_code and (code := need(f.in_code)) is not None:
        ok &= ~code.astype(bool)
    if not policy.loose_digits and (digits := need(f.digits)) is not None:
        ok &= ~digits.astype(bool)
    if policy.own_only and (own := need(f.own)) is not None:
        ok &= own.astype(bool)
    return ok


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one round keeps.

    accepted: n, how many drafted tokens are kept (a prefix of the draft).
    loose: 0-based positions among those n that were loosely accepted (mismatches kept).
    next_token: the correction (n < m) or the bonus token (n == m), emitted after the n.
    gate_rejected: the round stopped at a mismatch that the window would have kept but the
        entropy gate refused (the target was confident there).
    guard_rejected: the round stopped at a mismatch that window and gate would have kept but a
        safeguard refused.
    provisional: cross-round only: position of a mismatch kept pending its window.
    window_left: exact matches later rounds must still show to confirm a pending mismatch.
    confirmed: a window left pending by an earlier round was completed in this round.
    refuted_at: a pending window was broken by a mismatch at this drafted position; the
        caller must roll back to the pending mismatch (the other fields are then meaningless).
    """

    accepted: int
    loose: tuple[int, ...]
    next_token: int
    gate_rejected: bool
    provisional: int | None = None
    window_left: int = 0
    confirmed: bool = False
    refuted_at: int | None = None
    guard_rejected: bool = False

    @property
    def n_exact(self) -> int:
        return self.accepted - len(self.loose) - (self.provisional is not None)

    def stop_at(self, i: int, token: int) -> Verdict:
        """This verdict of exact matches cut at drafted position ``i`` (< accepted), where the
        target's own ``token`` comes next."""
        assert i < self.accepted and not self.loose and self.provisional is None and not self.confirmed
        return Verdict(i, (), token, False)


def exact_matches(drafted: np.ndarray, target: np.ndarray, target_alt: np.ndarray | None = None) -> np.ndarray:
    """(m,) bool: drafted tokens equal to the target's (or to its second draw, when given)."""
    m = drafted.shape[0]
    exact = drafted == target[:m]
    if target_alt is not None:
        exact |= drafted == np.asarray(target_alt)[:m]
    return exact


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


def _in_round(
    drafted: np.ndarray,
    target: np.ndarray,
    entropy: np.ndarray | None,
    policy: AcceptPolicy,
    target_alt: np.ndarray | None = None,
    facts: Facts | None = None,
) -> Verdict:
    """The published rule, and the safeguards, on one round's arrays (see ``judge``)."""
    m = drafted.shape[0]
    assert target.shape[0] == m + 1, "target needs one token per drafted position plus the bonus"
    exact = exact_matches(drafted, target, target_alt)

    if policy.loosens and entropy is not None and not exact.all():
        windowed = window_ok(exact, policy.window)
        gate_open = np.asarray(entropy)[:m] >= policy.entropy_threshold
        guard_ok = admitted(policy, facts, m)
        keep = exact | (windowed & gate_open & guard_ok)
    else:
        windowed = gate_open = guard_ok = None
        keep = exact

    rejected = np.flatnonzero(~keep)
    n = int(rejected[0]) if rejected.size else m
    loose = tuple(int(i) for i in np.flatnonzero(~exact[:n]))
    gate_rejected = bool(windowed is not None and n < m and windowed[n] and not gate_open[n])
    guard_rejected = bool(windowed is not None and n < m and windowed[n] and gate_open[n] and not guard_ok[n])
    return Verdict(accepted=n, loose=loose, next_token=int(target[n]), gate_rejected=gate_rejected,
                   guard_rejected=guard_rejected)


def entropy_needed(drafted: np.ndarray, target: np.ndarray, policy: AcceptPolicy, *,
                   cross_round: bool = False, window_left: int = 0) -> np.ndarray:
    """Positions whose entropy (and ``Facts``) can change the verdict: window-ok mismatches
    before the first mismatch that nothing could save (and, cross-round, that one when it may
    turn provisional). Lets callers compute them only there. (bool, (m,))"""
    drafted = np.asarray(drafted)
    m = drafted.shape[0]
    exact = drafted == np.asarray(target)[:m]
    need = np.zeros(m, dtype=bool)
    if not policy.loosens or exact.all():
        return need
    first = int(np.argmin(exact))
    if window_left == 0 and first >= m - policy.window:
        # most rounds: the first mismatch is too late for its window, so it is the hopeless one
        need[first] = cross_round and bool(exact[first + 1:].all())
        return need
    start = 0
    if window_left > 0:
        if m <= window_left or not exact[:window_left].all():
            return need  # the pending window stays open or is refuted: no entropy matters
        start = window_left
    exact = exact[start:]
    candidate = ~exact & window_ok(exact, policy.window)
    hopeless = np.flatnonzero(~exact & ~candidate)
    if hopeless.size:
        first = hopeless[0]
        candidate[first:] = False
        candidate[first] = cross_round and bool(exact[first + 1:].all())
    need[start:] = candidate
    return need


def _pending_progress(exact: np.ndarray, window_left: int) -> tuple[str, int]:
    """How a pending window fares against this round's exact matches:
    ("refuted", j), ("open", exact matches still needed) or ("confirmed", drafted tokens used)."""
    misses = np.flatnonzero(~exact)
    first_miss = int(misses[0]) if misses.size else exact.shape[0]
    if first_miss < min(window_left, exact.shape[0]):
        return "refuted", first_miss
    if exact.shape[0] < window_left:
        return "open", window_left - exact.shape[0]
    return "confirmed", window_left


def judge(
    drafted: np.ndarray,
    target: np.ndarray,
    entropy: np.ndarray | None,
    policy: AcceptPolicy,
    target_alt: np.ndarray | None = None,
    *,
    cross_round: bool = False,
    window_left: int = 0,
    max_left: int | None = None,
    facts: Facts | None = None,
) -> Verdict:
    """Judge one round: the accept rule.

    drafted: (m,) int token ids. target: (m+1,) int, the target's token at each drafted
    position and the bonus position. entropy: (m,) float top-3 entropy of the target's raw
    logits at each drafted position (may be None when the policy can never loosen, or hold
    values only where ``entropy_needed`` says they matter). target_alt: optional (m,) int
    second target sample (authors' sampling rule). facts: what the policy's safeguards read
    (None: no safeguard can pass, so a guarded policy keeps exact matches only).

    Without the cross-round options this is the published in-round rule. With them it first
    settles a window left pending by earlier rounds (``window_left`` exact matches still
    needed), then judges the rest of the draft, and, with ``cross_round``, keeps a gated tail
    mismatch provisionally, if its window needs at most ``max_left`` more exact matches
    (None: any)."""
    drafted = np.asarray(drafted)
    target = np.asarray(target)
    m = drafted.shape[0]
    exact = exact_matches(drafted, target, target_alt)
    if window_left == 0 and (exact.all() or not policy.loosens or entropy is None):  # every round of spd, most of fly's
        n = m if exact.all() else int(np.argmin(exact))
        return Verdict(n, (), int(target[n]), False)
    start, confirmed = 0, False
    if window_left > 0:
        state, n = _pending_progress(exact, window_left)
        if state == "refuted":
            return Verdict(accepted=0, loose=(), next_token=int(target[0]), gate_rejected=False, refuted_at=n)
        if state == "open":
            return Verdict(accepted=m, loose=(), next_token=int(target[m]), gate_rejected=False, window_left=n)
        start, confirmed = n, True
    rest = _in_round(drafted[start:], target[start:], None if entropy is None else np.asarray(entropy)[start:],
                  policy, None if target_alt is None else np.asarray(target_alt)[start:m],
                  None if facts is None else facts.tail(start))
    n = start + rest.accepted
    loose = tuple(start + i for i in rest.loose)
    tail = n < m and cross_round and entropy is not None and policy.loosens and bool(exact[n + 1:].all())
    gate_open = tail and bool(np.asarray(entropy)[n] >= policy.entropy_threshold)
    guard_ok = tail and bool(admitted(policy, facts, m)[n])
    if gate_open and guard_ok:
        left = (policy.window - 1) - (m - 1 - n)  # >= 0: n is among the last W positions
        if left == 0:  # the whole window is inside the draft: an ordinary loose accept
            return Verdict(m, (*loose, n), int(target[m]), False, confirmed=confirmed)
        if max_left is None or left <= max_left:
            return Verdict(m, loose, int(target[m]), False, provisional=n, window_left=left, confirmed=confirmed)
    gate_rejected = rest.gate_rejected or (tail and not gate_open)
    guard_rejected = rest.guard_rejected or (gate_open and not guard_ok)
    return Verdict(n, loose, int(target[n]), gate_rejected, confirmed=confirmed, guard_rejected=guard_rejected)

"""The target's side of a round: one batch of logits in, the accept rule's verdict out.

Greedy rounds take the target's argmax per row (after penalties) and compute FLy's top-3
entropy only at the rows where it can change the verdict (``accept.entropy_needed``), reading
llama.cpp's buffer in place. Sampled rounds compare the drafted tokens with the target's own
draws (``fly_cpp.backend.sampling``: a draw depends only on the seed, the position and the history):

- ``spd``, and ``fly`` with loosening switched off: a drafted token is kept when it is the
  target's draw at its position; the correction and the bonus are the target's draws. This is
  lossless (every emitted token is exactly the target's sample) and keeps a greedy draft's
  token d with probability p(d), as rejection sampling would; with the same seed, ``spd`` and
  ``target`` write the same tokens.
- ``fly`` (a policy that loosens) under the published rule: the authors'. The target is drawn
  twice per position (two streams); a drafted token is an exact match when either draw equals
  it; the correction and the bonus are the first draw. Window and gate then apply unchanged
  (the gate on raw logits).
- ``fly`` under the guarded rule (``own_only``): one draw, as ``spd``; window, gate and
  safeguards then decide the mismatches. Whether a second draw matched would hang on whether a
  draft reached the position, which k auto decides from timings.

A guarded policy's safeguards read ``accept.Facts``, computed like the entropies only at the
rows where they can change the verdict (candidate mismatches): the drafted token's logit against
the row's largest (ratio and rank, read in place), whether the target's sampler could draw it,
whether it sits in a code block of the answer (``fences``, from the tokens' bytes), and whether
it or the target's token there spells a digit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter

import numpy as np

from fly_cpp.backend import rows
from fly_cpp.backend.sampling import Sampler
from fly_cpp.basics.fences import Fences
from fly_cpp.rounds.accept import Facts, Verdict, admitted, entropy_needed, judge
from fly_cpp.rounds.constrain import Constraint
from fly_cpp.rounds.crossround import Window
from fly_cpp.rounds.keep import Keep
from fly_cpp.rounds.request import Request


class Verifier:
    """Judges the rounds of one generation (holds its sampler, so its seed)."""

    def __init__(self, request: Request, piece: Callable[[int], bytes] | None = None,
                 constraint: Constraint | None = None) -> None:
        """``piece`` (token -> bytes) lets the code-block safeguard see the text; without it
        a policy that needs the text loosens nothing. ``constraint``: the request's grammar;
        every row is masked with the grammar's state there before anything reads it, so the
        accept rule only ever sees, and keeps, tokens the grammar allows."""
        self.constraint = constraint
        self.policy = request.rules.policy
        self.sampler = Sampler(request.sampling, request.seed, request.bias, len(request.prompt))
        self.fences = Fences(piece, len(request.prompt)) if piece is not None and not self.policy.loose_in_code else None
        self.piece = piece
        self.window_size = request.rules.window  # tokens an asked mismatch's window spans (1: none)

    def rebase(self, committed: list[int], drop: int) -> None:
        """Before a context shift takes ``drop`` tokens out of ``committed`` (``fly_cpp.rounds.shift``):
        the sampler's draws, the grammar and the code fences count the generated text on as if
        nothing had been dropped."""
        self.sampler.start -= drop
        for part in (self.constraint, self.fences):
            if part is not None:
                part.rebase(committed, drop)

    def usable(self, committed: list[int], drafted: list[int]) -> list[int]:
        """The part of a draft worth verifying: under a grammar, up to its first forbidden token."""
        return drafted if self.constraint is None else self.constraint.usable(committed, drafted)

    @property
    def own_only(self) -> bool:
        """FLy's plan-independent rule: only the draft model's own tokens are loosened."""
        return self.policy.own_only and self.policy.loosens

    def facts(self, logits: np.ndarray, drafted: list[int], committed: list[int], at: np.ndarray,
              chosen: np.ndarray, own: bool = False) -> Facts | None:
        """The safeguards' facts at rows ``at`` (None when the policy has none or ``at`` is empty);
        ``chosen``: the target's token per row; ``own``: the drafted tokens are the draft model's."""
        policy, m = self.policy, len(drafted)
        if not policy.guarded or not at.size:
            return None
        sampled = not self.sampler.settings.greedy
        log_ratio = np.full(m, np.nan) if policy.min_ratio > 0 else None
        rank = np.zeros(m, dtype=np.int64) if policy.top_n > 0 else None
        supported = np.zeros(m, dtype=bool) if policy.supported else None
        digits = np.zeros(m, dtype=bool) if not policy.loose_digits and self.piece is not None else None
        for i in at:
            row, d = logits[i], drafted[i]  # row: a view of llama.cpp's buffer
            logit = row[d]
            if log_ratio is not None:
                log_ratio[i] = float(logit) - float(row.max())
            if rank is not None:
                rank[i] = int(np.count_nonzero(row > logit))
            if supported is not None:
                if sampled:
                    supported[i] = bool((self.sampler.distribution(row, committed + drafted[:i])[0] == d).any())
                else:
                    supported[i] = bool(np.isfinite(logit))
            if digits is not None:
                digits[i] = any(c in b"0123456789" for t in (d, int(chosen[i])) for c in self.piece(t))
        in_code = None if self.fences is None else self.fences.inside(committed, drafted)
        return Facts(log_ratio, rank, supported, in_code, digits, np.full(m, own) if policy.own_only else None)

    def may_loosen(self, row: np.ndarray, chosen: int) -> bool:
        """At a row no draft of the draft model's reached (``chosen``: the target's token there):
        could some other token be loosened? The gate must be open, and where the policy asks for
        a plausibility floor some other token must reach it. May say yes where nothing passes
        (the draft model's token then decides, ``admits``); never no where one would."""
        policy = self.policy
        if not policy.loosens or rows.top_entropy(row[None])[0] < policy.entropy_threshold:
            return False
        if policy.min_ratio > 0 and policy.guarded:
            floor = float(row.max()) + float(np.log(policy.min_ratio))
            return int(np.count_nonzero(row >= floor)) - int(row[chosen] >= floor) > 0
        return True

    def first_open(self, logits: np.ndarray, committed: list[int], tokens: list[int]) -> int | None:
        """The first row i of ``logits`` (the target's rows at exactly matched ``tokens`` that
        the draft model did not propose) where some other token might be loosened (``may_loosen``),
        or None: there the draft model's own token must be asked for."""
        for i, token in enumerate(tokens):
            if self.may_loosen(logits[i], token):
                return i
        return None

    def admits(self, row: np.ndarray, token: int, committed: list[int], chosen: int) -> bool:
        """Would the draft model's own ``token`` pass the gate and the safeguards at this row, as a
        drafted mismatch? (Its window is judged later, by the rounds that complete it.)"""
        if token == chosen or not np.isfinite(row[token]) or rows.top_entropy(row[None])[0] < self.policy.entropy_threshold:
            return False
        facts = self.facts(row[None], [token], committed, np.array([0]), np.array([chosen]), own=True)
        return bool(admitted(self.policy, facts, 1)[0])

    def __call__(self, logits: np.ndarray, drafted: list[int], committed: list[int], *, own: bool = False,
                 cross_round: bool = False, window_left: int = 0,
                 max_left: int | None = None) -> tuple[Verdict, np.ndarray]:
        """logits: (m+1, n_vocab) rows of [last committed, d_1..d_m]; ``own``: the drafted
        tokens are the draft model's own. Returns the verdict and the target's chosen token per
        row (argmax or first draw; -1 after the row that ends an exact-match round)."""
        m, policy, sampler = len(drafted), self.policy, self.sampler
        if self.constraint is not None:
            self.constraint.mask(logits, committed, drafted)
        if m == 0 and window_left == 0:  # the target alone: its token, nothing to judge
            token = sampler.greedy(logits, lambda i: committed) if sampler.settings.greedy else \
                np.array([sampler.sample(logits[0], committed)])
            return Verdict(0, (), int(token[0]), False), token
        draft_ids = np.asarray(drafted, dtype=np.int64)  # (m,)

        def history(i: int) -> list[int]:
            return committed + drafted[:i]

        options = {"cross_round": cross_round, "window_left": window_left, "max_left": max_left}
        if sampler.settings.greedy:
            chosen = sampler.greedy(logits, history)  # (m+1,)
        else:  # the target's draw per row, up to the first row that disagrees with the draft
            chosen = np.zeros(m + 1, dtype=np.int64)
            for i in range(m + 1):
                chosen[i] = sampler.sample(logits[i], history(i))
                if i < m and chosen[i] != drafted[i] and not policy.loosens:
                    chosen[i + 1:] = -1  # never compared: the round stops here
                    break
        if sampler.settings.greedy or not policy.loosens or policy.own_only:
            need = np.flatnonzero(entropy_needed(draft_ids, chosen, policy, cross_round=cross_round,
                                                 window_left=window_left))
            entropy = None
            if need.size:
                entropy = np.zeros(m)
                # contiguous row slices are views of llama.cpp's buffer; fancy indexing would copy them
                for i in need:
                    entropy[i] = rows.top_entropy(logits[i : i + 1])[0]
            facts = self.facts(logits, drafted, committed, need, chosen, own)
            return judge(draft_ids, chosen, entropy, policy, facts=facts, **options), chosen
        second = np.array([sampler.sample(logits[i], history(i), stream=1) for i in range(m)])
        facts = self.facts(logits, drafted, committed, np.flatnonzero((draft_ids != chosen[:m]) & (draft_ids != second)),
                           chosen, own)
        return judge(draft_ids, chosen, rows.top_entropy(logits[:m]), policy, second, facts=facts, **options), chosen

    def own_token(self, row: np.ndarray, history: list[int], chosen: int,
                  candidate: Callable[[Sequence[int]], int | None]) -> int | None:
        """The draft model's own token after ``history`` (``candidate``'s), where it passes the gate
        and the safeguards at ``row`` (the target's, whose token there is ``chosen``), else None."""
        token = candidate(history)
        return token if token is not None and self.admits(row, token, history, chosen) else None

    def keep(self, logits: np.ndarray, drafted: list[int], committed: list[int], verdict: Verdict,
             chosen: np.ndarray, window: Window, by_model: bool, candidate: Callable[[Sequence[int]], int | None] | None,
             number: int) -> Keep:
        """Round ``number``'s keep from its ``verdict`` (``__call__``'s, with ``chosen``), the open
        ``window`` told of it. Under FLy's plan-independent rule (``own_only``) a guess the target
        kept stands only where the draft model's own token could not have been loosened instead,
        and where no draft of the draft model's reached the target's token, the draft model's own
        token there (``candidate``; None: no draft model) is kept loosely when it passes the gate
        and the safeguards, held for its window where the rule has one."""
        own_only = self.own_only and candidate is not None
        if own_only and not by_model and verdict.accepted:
            cut = self.first_open(logits, committed, drafted[: verdict.accepted])
            if cut is not None:
                verdict = verdict.stop_at(cut, drafted[cut])
        n = verdict.accepted
        confirmed = window.observe(verdict, len(drafted), len(committed), chosen, number)
        tokens = [*drafted[:n], verdict.next_token]
        if not own_only or window.pending is not None or (n < len(drafted) and by_model):
            return Keep(verdict, tokens, confirmed=confirmed)
        assert candidate is not None
        t0, history, row = perf_counter(), committed + drafted[:n], logits[n]
        if not self.may_loosen(row, verdict.next_token):
            return Keep(verdict, tokens, confirmed=confirmed, ask_seconds=perf_counter() - t0)
        token = self.own_token(row, history, verdict.next_token, candidate)
        seconds = perf_counter() - t0
        if token is None:
            return Keep(verdict, tokens, confirmed=confirmed, n_asked=1, ask_seconds=seconds)
        held = self.window_size > 1
        if held:  # kept pending the draft model's continuation
            window.hold(len(committed) + n, verdict.next_token, self.window_size - 1, number)
        return Keep(verdict, [*tokens[:-1], token], True, held, confirmed, 1, seconds)

"""The speculative loop: draft, verify in one target pass, keep, roll back, emit.

Position invariant (asserted each round): before a round, the target's KV cache holds every
committed token but the last (``target.tokens == committed[:-1]``). The round decodes
[last committed, d_1..d_m] in one batch, which yields the m+1 rows of logits it needs, keeps
n drafted tokens, and rolls the cache back to ``committed + d_1..d_n``; the correction or bonus
token t_{n+1} is committed without being decoded, which restores the invariant. The draft model
keeps the same invariant on its own cache (``Context.sync``): after a full accept its catch-up
is decoding d_m, which it drafted but never fed itself.

A tree's round (``Draft.branch``, ``fly_cpp.drafters.tree``) decodes its branch beside the chain
in the same target decode (``Context.decode_tree``); where the target drew the branch's first token
at the fork, the branch's path is verified as the round's draft, and the cache keeps only the text
before the fork: the next round's batch decodes the path's tokens before its own (the cache then
holds fewer than all but the last committed token, for one round), so that the cache's cells stay
in the order of their positions.

Cross-round window (``fly_cpp.rounds.crossround``): a provisionally kept mismatch at committed
position p is followed by held tokens. Refuting it cuts ``committed`` back to p, puts the
target's own token there and truncates the target cache to p, which is the invariant again;
the draft cache re-syncs by common prefix on its next draft. A rollback that far reaches past
the round's own decode, so the round that keeps a mismatch asks the target cache for a way
back to p (``Context.checkpoint``: nothing on a KV cache; a recurrent state's copy).

Target-only decoding is the same loop with empty drafts (m = 0); when the target's choice is
its raw argmax, its rounds are decoded in runs inside the native library (``fly_cpp.rounds.runs``), and
so are the rounds a drafter leaves to the target alone (``Draft.alone``) where verification is exact.
There, and in greedy speculative generations (in a slot too), the first token comes from the
prompt's last row (``Runs.start``), before the first round, and goes out before the draft model's
prompt is decoded (which only the rounds need); where a loosening rule could keep the draft model's
token there instead (``_open_first``), the first round verifies it as before.

A text that fills the context (the cache holding n_ctx - 1 tokens, as llama-server stops) ends
there, or with ``request.shift`` drops part of its middle and goes on (``fly_cpp.rounds.shift``).
"""

from __future__ import annotations

from collections.abc import Iterator
from time import perf_counter

import numpy as np

from fly_cpp.backend.cache import common_prefix
from fly_cpp.backend.context import Context
from fly_cpp.basics.errors import CacheFull
from fly_cpp.drafters.seam import Draft, Drafter, Report
from fly_cpp.rounds.accept import Verdict
from fly_cpp.rounds.constrain import Constraint, Rules
from fly_cpp.rounds.crossround import Window
from fly_cpp.rounds.keep import Keep
from fly_cpp.rounds.output import Output
from fly_cpp.rounds.prefill import prefill
from fly_cpp.rounds.request import Request
from fly_cpp.rounds.runs import Runs
from fly_cpp.rounds.scoring import token_probs
from fly_cpp.rounds.shape import Steady, padded
from fly_cpp.rounds.shift import shift
from fly_cpp.rounds.step import Progress, Round, Step, TokenProbs
from fly_cpp.rounds.verify import Verifier


def run(request: Request, target: Context, drafter: Drafter | None, out: Output,
        steady: Steady | None = None, grammar: Rules | None = None) -> Iterator[Step | Progress]:
    """Generate ``request`` on ``target`` with ``drafter`` (None: target only), releasing
    tokens through ``out`` (which keeps the stats and records how the text ends). ``steady``:
    pad the verification batches to its width (``fly_cpp.rounds.shape``). ``grammar``: its state
    before the first generated token; every emitted token obeys it (``fly_cpp.rounds.constrain``).
    Before the first token it yields a ``Progress`` per batch of the prompt (``fly_cpp.rounds.prefill``)."""
    return _Loop(request, target, drafter, out, steady, grammar).run()


class _Loop:
    """One generation's rounds: what they share (the committed text, the verifier, the open
    window, the native runs) and the round itself (``round``)."""

    def __init__(self, request: Request, target: Context, drafter: Drafter | None, out: Output,
                 steady: Steady | None, grammar: Rules | None) -> None:
        self.request, self.rules, self.target, self.drafter, self.out, self.steady = (
            request, request.rules, target, drafter, out, steady)
        self.stats = out.stats
        constraint = None if grammar is None else Constraint(grammar, len(request.prompt), request.bias.banned)
        self.constrained = constraint is not None
        self.verify, self.window = Verifier(request, out.detok.piece, constraint), Window(request.rules)
        self.committed = list(request.prompt)
        self.runs = Runs.make(request, target, drafter is not None, self.constrained) if steady is None else None

    def run(self) -> Iterator[Step | Progress]:
        request, target, drafter, out, stats, committed = (
            self.request, self.target, self.drafter, self.out, self.stats, self.committed)
        begin = perf_counter()
        stats.n_cached = min(common_prefix(target.tokens, committed[:-1]), len(committed) - 1)
        runs = self.runs
        first = runs or (Runs.first(request, target, self.constrained) if self.steady is None else None)
        if first is None or out.finish is not None or len(committed) > target.n_ctx:
            first = None  # else: the prompt decoded through its last token, the first token picked
        # under a loosening rule the row may leave the first token to the first round (``Runs.start``)
        open_at = self._open_first if drafter is not None and self.verify.policy.loosens else None
        try:
            taken = yield from prefill(committed, target, first, out, begin, open_at)
        except CacheFull:
            taken = self._cache_full()
        waited = 0.0  # time spent by the consumer on the first token, not ours to count
        if taken:  # the first token, from the prompt's row: out before the draft's prompt and the rounds
            t3 = perf_counter()
            yield from out.take()
            waited = perf_counter() - t3
        if drafter is not None and out.finish is None:  # the draft's prompt too (a model drafter's cache), before the rounds' clock
            try:
                drafter.begin(committed)
            except CacheFull:  # the draft's shared cache had no room for it
                self._cache_full()
        prompt_left = first is None  # the prompt's last batch, which the first round's decode finishes
        start = perf_counter()
        stats.prompt_seconds = start - begin - waited
        paused = 0.0  # time spent by the consumer between our yields, not ours to count
        try:
            while out.finish is None:
                # tokens a round may still commit: the text ends (or shifts) once it fills the
                # context, the cache then holding n_ctx - 1 tokens, as llama-server stops
                room = target.n_ctx - len(committed)
                if room <= 0 and self.window.pending is None:
                    self._caught_up()
                    if request.shift is None or not shift(request.shift, committed, target, drafter, self.verify, stats):
                        out.end("length", "limit", context_full=True)
                        break
                    room = target.n_ctx - len(committed)
                held = len(target.tokens)  # all but the last committed token (fewer after a tree's branch)
                assert held <= len(committed) - 1 and target.tokens[-8:] == committed[max(held - 8, 0):held]
                try:
                    if runs is not None and drafter is None:  # target-only greedy, several tokens a return (``runs``)
                        runs.run(committed, out)
                    elif (decoded := self.round(room, prompt_left)) is not None and prompt_left:
                        prompt_left = False  # this round's decode finished the prompt's last batch
                        stats.first_seconds = decoded - start
                        yield Progress(len(request.prompt), stats.n_cached, len(request.prompt), decoded - begin)
                except CacheFull:
                    self._cache_full()
                t3 = perf_counter()
                yield from out.take()
                paused += perf_counter() - t3
            yield from out.take()
        finally:
            stats.seconds = perf_counter() - start - paused

    def _cache_full(self) -> bool:
        """A cache shared by slots had no room for this slot's decode: the text ends as at a
        full context (what was committed stays), its caches are emptied by the engine after."""
        self.stats.cache_full = True
        self.out.end("length", "limit", context_full=True)
        return False

    def round(self, room: int, prompt_left: bool) -> float | None:
        """One round: draft, verify the draft in one target decode, apply what it keeps, tell
        the drafter. Returns when the target's decode ended (None: the round verified nothing:
        the target decoded alone in a native run, or an open window was refuted)."""
        rules, target, drafter, window, committed = self.rules, self.target, self.drafter, self.window, self.committed
        # a round verifies at most k drafts, in one batch, within the cache and the token budget
        budget = self.request.max_tokens - self.stats.n_tokens - len(self.out.held) - 1
        limit = min(rules.max_draft, room - 1, target.n_batch - 1, max(budget, window.left))
        t0 = perf_counter()
        draft = drafter.draft(committed, limit, window.left) if drafter is not None and limit > 0 else Draft()
        if self._alone(draft, min(draft.alone, room - 1, budget), limit <= 0 and window.pending is None, prompt_left, t0,
                       draft.alone > budget and budget + 1 < room):
            return None
        drafted = self.verify.usable(committed, draft.tokens)
        if len(drafted) < min(rules.n_min, limit) and window.pending is None:
            drafted = []  # too short to be worth verifying (llama.cpp's --draft-min): the target decodes alone
        if window.pending is not None and not drafted:  # nothing left to complete the window with
            self.stats.refuted(self._refute(self.stats.n_rounds))
            return None
        t1 = perf_counter()
        catch = committed[len(target.tokens):]  # the last committed token (and a path a tree's branch took)
        batch, rows = [*catch, *drafted], len(drafted) + 1
        branch = draft.branch if (draft.branch is not None and len(drafted) == len(draft) and self.steady is None
                                  and window.pending is None and not self.constrained) else None
        if branch is not None:  # a tree (``fly_cpp.drafters.tree``): the chain's rows, then the branch's
            width = rows + len(branch.tokens)
            logits = target.decode_tree(batch, len(catch) + branch.fork, branch.tokens, rows)
        elif len(catch) > 1:  # after a round that took a tree's branch (no steady batches there)
            width = rows
            logits = target.decode(batch, logits=rows)
        else:
            width = len(batch) if self.steady is None else self.steady.width(len(batch), room + 1)
            # (m+1, n_vocab) view; padded rows are rolled back below with the rejected ones
            logits = target.decode(padded(batch, width), logits="all")[: len(batch)]
        t2 = perf_counter()
        options = {"own": draft.by_model, "cross_round": window.enabled, "window_left": window.left,
                   "max_left": window.max_left()}
        verdict, chosen = self.verify(logits[:rows], drafted, committed, **options)
        verified = len(drafted) + (len(branch.tokens) if branch is not None else 0)
        record = Round(self.stats.n_rounds + 1, verified, draft_seconds=t1 - t0, target_seconds=t2 - t1)
        if branch is not None:
            if verdict.accepted == branch.fork and chosen[branch.fork] == branch.tokens[0]:
                # the target drew the branch's first token where the chain's was not: the branch's path is the
                # round's; the cache keeps the text before the fork, and the next round's batch decodes the rest
                target.truncate(len(committed) + branch.fork)
                drafted = [*drafted[: branch.fork], *branch.tokens]
                logits = np.concatenate([logits[: branch.fork + 1], logits[rows:]])
                verdict, chosen = self.verify(logits, drafted, committed, **options)
                record.branched = True
            else:
                logits = logits[:rows]
        self._apply(record, logits, drafted, draft.by_model, verdict, chosen)
        self.stats.add(record)
        if drafter is not None:  # how the round went, for the drafter
            drafter.accept(Report(draft, len(drafted), verdict.accepted if verdict.refuted_at is None else 0, committed,
                                  record.draft_seconds, t2 - t1, perf_counter() - t0, width))
        return t2

    def _alone(self, draft: Draft, alone: int, last: bool, prompt_left: bool, t0: float, to_end: bool = False) -> bool:
        """Decode the rounds a drafter left to the target alone (``alone`` of them), or the text's
        last token (``last``: nothing may be drafted), as one native run, as target-only decodes;
        whether it did. ``to_end``: the rest goes past the budget's last token, whose round drafts
        nothing (``last``): it is decoded in the same run and reported as its own round, as it is
        round by round (a native run of its own for it made a fifth of k auto's runs on the
        bundled pair, one an answer)."""
        runs, drafter, committed = self.runs, self.drafter, self.committed
        if runs is None or drafter is None or not (alone > 0 or last) or draft.tokens or prompt_left:
            return False
        self._caught_up()
        t1, before = perf_counter(), len(committed)
        decoding = runs.run(committed, self.out, max(alone, 1) + to_end)
        self.stats.draft_seconds += t1 - t0
        rounds, seconds = len(committed) - before, perf_counter() - t0
        if to_end and rounds > alone:  # the last round's own report, its share of the run
            share = decoding / rounds
            drafter.accept(Report(draft, 0, 0, committed[:-1], t1 - t0, decoding - share, seconds - share, 1, alone))
            drafter.accept(Report(Draft(), 0, 0, committed, 0.0, share, share, 1, 1))
        else:
            drafter.accept(Report(draft, 0, 0, committed, t1 - t0, decoding, seconds, 1, rounds))
        return True

    def _caught_up(self) -> None:
        """The target's cache brought to all but the last committed token, where a round that took
        a tree's branch left it short (the next round's batch decodes the rest, a run or a shift
        cannot)."""
        if len(self.target.tokens) < len(self.committed) - 1:
            self.target.decode(self.committed[len(self.target.tokens):-1], logits="none")

    def _apply(self, record: Round, logits: np.ndarray, drafted: list[int], by_model: bool, verdict: Verdict,
               chosen: np.ndarray) -> None:
        """Apply the round's verdict: a refuted window rolled back, else what the round keeps
        (the verifier's ``Keep``) committed and released, the open window's mismatch given a way
        back, the cache rolled back to all but the last committed token."""
        out, window, committed = self.out, self.window, self.committed
        if verdict.refuted_at is not None:
            record.refuted_rounds = self._refute(record.number)
            return
        candidate = self.drafter.candidate if self.drafter is not None else None
        keep = self.verify.keep(logits, drafted, committed, verdict, chosen, window, by_model, candidate, record.number)
        base, tokens = len(committed), list(keep.tokens)
        record.tally(keep)
        if keep.confirmed:
            out.confirm()
        probs, pending = self._probs(logits, tokens, base), window.pending
        if pending is not None and base <= pending.pos:  # opened this round: it may come back to its mismatch
            self.target.checkpoint(pending.pos)
        if pending is not None and pending.pos < base + len(tokens) - 1:
            tokens.pop()  # while a window is open the target's own token after the drafts proves nothing
        self.target.truncate(base + len(tokens) - 1)  # invariant: the cache holds all but the last committed token
        self._commit(record, keep, tokens, probs)

    def _commit(self, record: Round, keep: Keep, tokens: list[int], probs: list[TokenProbs] | None) -> None:
        """Commit and release a round's ``tokens`` (those ``keep`` keeps, less one a window's
        opening left unproved), each as it was kept; a held token that ends the text refutes its
        window (it cannot be completed past the end)."""
        out, window, committed = self.out, self.window, self.committed
        base = len(committed)
        for i, token in enumerate(tokens):
            held = window.holds(base + i)
            if held and out.is_eog(token):
                record.refuted_rounds = self._refute(record.number)
                break
            committed.append(token)
            own = keep.asked and i == keep.verdict.accepted
            out.add(token, drafted=i < keep.verdict.accepted or own, loose=keep.loose(i) or window.is_pending(base + i),
                    round=record.number, hold=held, probs=probs[i] if probs is not None else None)
            if out.finish is not None:
                break

    def _probs(self, logits: np.ndarray, tokens: list[int], base: int) -> list[TokenProbs] | None:
        """With ``n_probs``, the target's view of the round's ``tokens`` (from the rows that
        verified them), and of its own token at a window opened among them, should it fail."""
        n_probs, pending = self.request.n_probs, self.window.pending
        if not n_probs:
            return None
        if pending is not None and base <= pending.pos < base + len(tokens):
            at = pending.pos - base
            self.window.correction_probs(token_probs(logits[at:], [pending.correction], n_probs)[0])
        return token_probs(logits, tokens, n_probs)

    def _open_first(self, row: np.ndarray, chosen: int) -> bool:
        """At the prompt's last row (``chosen``: the target's token there): could the rule keep
        another token in the first position? Under FLy's plan-independent rule only the draft
        model's own token can be kept there, so it is asked, as a round asks (``Verifier.keep``); the
        published rule may keep whatever a first draft holds wherever the gate is open."""
        verify, drafter, committed = self.verify, self.drafter, self.committed
        assert drafter is not None
        if not verify.may_loosen(row, chosen):
            return False
        if not verify.own_only:
            return True
        row = np.array(row)  # a view of the target's buffer: other slots' decodes may reuse it meanwhile
        drafter.begin(committed)
        self.stats.asked()
        return verify.own_token(row, committed, chosen, drafter.candidate) is not None

    def _refute(self, number: int) -> int:
        """Roll back to the open window's mismatch and commit the target's own token there, in
        round ``number``; returns the rounds the refuted segment took."""
        pending = self.window.refute()
        committed = self.committed
        del committed[pending.pos:]
        committed.append(pending.correction)
        self.target.truncate(pending.pos)
        self.out.refute()
        self.out.add(pending.correction, drafted=False, loose=False, round=pending.round, probs=pending.probs)
        return number - pending.round

"""The speculative loop: draft, verify in one target pass, keep, roll back, emit.

Position invariant (asserted each round): before a round, the target's KV cache holds every
committed token but the last (``target.tokens == committed[:-1]``). The round decodes
[last committed, d_1..d_m] in one batch, which yields the m+1 rows of logits it needs, keeps
n drafted tokens, and rolls the cache back to ``committed + d_1..d_n``; the correction or bonus
token t_{n+1} is committed without being decoded, which restores the invariant. The draft model
keeps the same invariant on its own cache (``Context.sync``): after a full accept its catch-up
is decoding d_m, which it drafted but never fed itself.

Cross-round window (``fly_cpp.crossround``): a provisionally kept mismatch at committed
position p is followed by held tokens. Refuting it cuts ``committed`` back to p, puts the
target's own token there and truncates the target cache to p, which is the invariant again;
the draft cache re-syncs by common prefix on its next draft. A rollback that far reaches past
the round's own decode, so the round that keeps a mismatch asks the target cache for a way
back to p (``Context.checkpoint``: nothing on a KV cache; a recurrent state's copy).

Target-only decoding is the same loop with empty drafts (m = 0); when the target's choice is
its raw argmax, its rounds are decoded in runs inside the native library (``fly_cpp.runs``), and
so are the rounds a drafter leaves to the target alone (``Draft.alone``) where verification is exact.
There, and in speculative generations whose verification is exact (in a slot too), the first
token comes from the prompt's last row (``Runs.start``), before the first round, and goes out
before the draft model's prompt is decoded (which only the rounds need).

A text that fills the context (the cache holding n_ctx - 1 tokens, as llama-server stops) ends
there, or with ``request.shift`` drops part of its middle and goes on (``fly_cpp.shift``).
"""

from __future__ import annotations

from collections.abc import Iterator
from time import perf_counter

import numpy as np

from fly_cpp.accept import Verdict
from fly_cpp.backend.cache import common_prefix
from fly_cpp.backend.context import Context
from fly_cpp.constrain import Constraint, Rules
from fly_cpp.crossround import Window
from fly_cpp.drafters import Draft, Drafter, Report
from fly_cpp.output import Output
from fly_cpp.prefill import prefill
from fly_cpp.request import Request
from fly_cpp.runs import Runs
from fly_cpp.scoring import token_probs
from fly_cpp.shape import Steady, padded
from fly_cpp.shift import shift
from fly_cpp.step import Progress, Stats, Step
from fly_cpp.verify import Verifier


def run(request: Request, target: Context, drafter: Drafter | None, out: Output,
        steady: Steady | None = None, grammar: Rules | None = None) -> Iterator[Step | Progress]:
    """Generate ``request`` on ``target`` with ``drafter`` (None: target only), releasing
    tokens through ``out`` (which keeps the stats and records how the text ends). ``steady``:
    pad the verification batches to its width (``fly_cpp.shape``). ``grammar``: its state
    before the first generated token; every emitted token obeys it (``fly_cpp.constrain``).
    Before the first token it yields a ``Progress`` per batch of the prompt (``fly_cpp.prefill``)."""
    spec, stats = request.spec, out.stats
    constraint = None if grammar is None else Constraint(grammar, len(request.prompt), request.bias.banned)
    verify, window = Verifier(request, out.detok.piece, constraint), Window(spec)
    committed = list(request.prompt)
    begin = perf_counter()
    stats.n_cached = min(common_prefix(target.tokens, committed[:-1]), len(committed) - 1)
    runs = Runs.make(request, target, drafter is not None, constraint is not None) if steady is None else None
    first = runs or (Runs.first(request, target, constraint is not None) if steady is None else None)
    if first is None or out.finish is not None or len(committed) > target.n_ctx:
        first = None  # else: the prompt decoded through its last token, the first token picked
    yield from prefill(committed, target, first, out, begin)
    waited = 0.0  # time spent by the consumer on the first token, not ours to count
    if first is not None:  # the first token, from the prompt's row: out before the draft's prompt and the rounds
        t3 = perf_counter()
        yield from out.take()
        waited = perf_counter() - t3
    if drafter is not None and out.finish is None:  # the draft's prompt too (a model drafter's cache), before the rounds' clock
        drafter.begin(committed)
    prompt_left = first is None  # the prompt's last token, which the first round decodes
    start = perf_counter()
    stats.prompt_seconds = start - begin - waited
    paused = 0.0  # time spent by the consumer between our yields, not ours to count
    try:
        while out.finish is None:
            # tokens a round may still commit: the text ends (or shifts) once it fills the
            # context, the cache then holding n_ctx - 1 tokens, as llama-server stops
            room = target.n_ctx - len(committed)
            if room <= 0 and window.pending is None:
                if request.shift is None or not shift(request.shift, committed, target, drafter, verify, stats):
                    out.end("length", "limit", context_full=True)
                    break
                room = target.n_ctx - len(committed)
            assert len(target.tokens) == len(committed) - 1 and target.tokens[-8:] == committed[-9:-1]
            if runs is not None and drafter is None:  # target-only greedy: several tokens per return to Python (fly_cpp.runs)
                runs.run(committed, out)
                t3 = perf_counter()
                yield from out.take()
                paused += perf_counter() - t3
                continue
            # a round verifies at most k drafts, in one batch, within the cache and the token budget
            limit = min(spec.max_draft, room - 1, target.n_batch - 1,
                        max(request.max_tokens - stats.n_tokens - len(out.held) - 1, window.left))
            t0 = perf_counter()
            draft = drafter.draft(committed, limit, window.left) if drafter is not None and limit > 0 else Draft()
            # rounds the drafter leaves to the target alone, of those it would be asked about
            alone = min(draft.alone, room - 1, request.max_tokens - stats.n_tokens - len(out.held) - 1)
            if runs is not None and drafter is not None and alone > 1 and not draft.tokens and not prompt_left:
                # decoded as one run, as target-only decodes (the last token's round stays a round)
                t1, before = perf_counter(), len(committed)
                decoding = runs.run(committed, out, alone)
                t3 = perf_counter()
                stats.draft_seconds += t1 - t0
                drafter.accept(Report(draft, 0, 0, committed, t1 - t0, decoding, t3 - t0, 1, len(committed) - before))
                yield from out.take()
                paused += perf_counter() - t3
                continue
            drafted = verify.usable(committed, draft.tokens)
            if len(drafted) < min(spec.n_min, limit) and window.pending is None:
                drafted = []  # too short to be worth verifying (llama.cpp's --draft-min): the target decodes alone
            if window.pending is not None and not drafted:  # nothing left to complete the window with
                _refute(window, committed, target, out)
                continue
            t1 = perf_counter()
            drafting = t1 - t0
            batch = [committed[-1], *drafted]
            width = len(batch) if steady is None else steady.width(len(batch), room + 1)
            # (m+1, n_vocab) view; padded rows are rolled back below with the rejected ones
            logits = target.decode(padded(batch, width), logits="all")[: len(batch)]
            t2 = perf_counter()
            verdict, chosen = verify(logits, drafted, committed, own=draft.by_model, cross_round=window.enabled,
                                     window_left=window.left, max_left=window.max_left())
            stats.target_seconds += t2 - t1
            stats.n_rounds += 1
            stats.n_drafts += bool(drafted)
            stats.n_drafted += len(drafted)
            stats.draft_lengths[len(drafted)] = stats.draft_lengths.get(len(drafted), 0) + 1
            if verdict.refuted_at is not None:
                _refute(window, committed, target, out)
                stats.accepted_lengths.append(1)
            else:
                if verify.own_only and not draft.by_model and verdict.accepted and drafter is not None:
                    # guesses the target kept may stand where the draft model would have said
                    # something else, loosely kept: FLy's rule there needs the draft model's token
                    cut = verify.first_open(logits, committed, drafted[: verdict.accepted])
                    if cut is not None:
                        verdict = verdict.stop_at(cut, drafted[cut])
                base, n = len(committed), verdict.accepted
                emitted = [*drafted[:n], verdict.next_token]
                asked = None  # the draft model's own token where the target wrote next_token, kept loosely
                confirmed = window.observe(verdict, len(drafted), base, chosen, stats.n_rounds)
                if confirmed:
                    out.confirm()
                    stats.n_confirmed += 1
                    stats.n_loose += 1
                if (window.pending is None and verify.own_only and drafter is not None
                        and not (n < len(drafted) and draft.by_model)):
                    t4 = perf_counter()
                    asked = _ask(verify, drafter, logits[n], committed + drafted[:n], verdict.next_token, stats)
                    drafting += perf_counter() - t4
                    if asked is not None:
                        emitted[-1] = asked
                        if spec.window > 1:  # kept pending the draft model's continuation
                            window.hold(base + n, verdict.next_token, spec.window - 1, stats.n_rounds)
                            stats.n_provisional += 1
                        else:
                            stats.n_loose += 1
                # n_probs: the rows that verified the emitted tokens are the target's view of them
                probs = token_probs(logits, emitted, request.n_probs) if request.n_probs else None
                pending = window.pending
                if probs is not None and pending is not None and base <= pending.pos < base + len(emitted):
                    at = pending.pos - base  # the target's own token there, should the window fail
                    pending.probs = token_probs(logits[at:], [pending.correction], request.n_probs)[0]
                if pending is not None and base <= pending.pos:  # opened this round: it may come back to its mismatch
                    target.checkpoint(pending.pos)
                if pending is not None and pending.pos < base + len(emitted) - 1:
                    emitted.pop()  # while a window is open the target's own token after the drafts proves nothing
                target.truncate(base + len(emitted) - 1)  # invariant: the cache holds all but the last committed token
                _count(stats, verdict)
                for i, token in enumerate(emitted):
                    held = window.holds(base + i)
                    if held and out.is_eog(token):  # a window cannot be completed past the end of the text
                        _refute(window, committed, target, out)
                        break
                    committed.append(token)
                    own = asked is not None and i == n
                    loose = i in verdict.loose or window.is_pending(base + i) or own
                    out.add(token, drafted=i < n or own, loose=loose, round=stats.n_rounds, hold=held,
                            probs=probs[i] if probs is not None else None)
                    if out.finish is not None:
                        break
            stats.draft_seconds += drafting
            t3 = perf_counter()
            if drafter is not None:
                kept = verdict.accepted if verdict.refuted_at is None else 0
                drafter.accept(Report(draft, len(drafted), kept, committed, drafting, t2 - t1, t3 - t0, width))
            if prompt_left:  # this round's decode finished the prompt's last batch
                prompt_left = False
                stats.first_seconds = t2 - start
                yield Progress(len(request.prompt), stats.n_cached, len(request.prompt), t2 - begin)
            yield from out.take()
            paused += perf_counter() - t3
        yield from out.take()
    finally:
        stats.seconds = perf_counter() - start - paused


def _count(stats: Stats, verdict: Verdict) -> None:
    """A verified round's verdict in the generation's counters."""
    stats.n_exact += verdict.n_exact
    stats.n_loose += len(verdict.loose)
    stats.n_gate_rejected += verdict.gate_rejected
    stats.n_guard_rejected += verdict.guard_rejected
    stats.n_provisional += verdict.provisional is not None
    stats.accepted_lengths.append(verdict.accepted + 1)


def _ask(verify: Verifier, drafter: Drafter, row: np.ndarray, history: list[int], chosen: int,
         stats: Stats) -> int | None:
    """FLy's rule where no draft of the draft model's reached (the target decoded alone, an
    n-gram guess stood there, or every drafted token was kept): if the target was unsure there
    and some other token could be kept, the draft model's own token there is a candidate like any
    drafted one. Returns it when it passes the gate and the safeguards (its window is judged by
    the next rounds), else None."""
    if not verify.may_loosen(row, chosen):
        return None
    token = drafter.candidate(history)
    stats.n_asked += 1
    if token is None or not verify.admits(row, token, history, chosen):
        return None
    return token


def _refute(window: Window, committed: list[int], target: Context, out: Output) -> None:
    """Roll back to the open window's mismatch and commit the target's own token there."""
    pending = window.refute()
    del committed[pending.pos:]
    committed.append(pending.correction)
    target.truncate(pending.pos)
    out.refute()
    out.stats.n_refuted += 1
    out.stats.n_refuted_rounds += out.stats.n_rounds - pending.round
    out.add(pending.correction, drafted=False, loose=False, round=pending.round, probs=pending.probs)

"""The speculative loop: draft, verify in one target pass, keep, roll back, emit.

Position invariant (asserted each round): before a round, the target's KV cache holds every
committed token but the last (``target.tokens == committed[:-1]``). The round decodes
[last committed, d_1..d_m] in one batch, which yields the m+1 rows of logits it needs, keeps
n drafted tokens, and rolls the cache back to ``committed + d_1..d_n``; the correction or bonus
token t_{n+1} is committed without being decoded, which restores the invariant. The draft model
keeps the same invariant on its own cache (``drafters.sync``): after a full accept its catch-up
is decoding d_m, which it drafted but never fed itself.

Cross-round window: a provisionally kept mismatch at committed position p (``Pending``) is
followed by held tokens. Refuting it cuts ``committed`` back to p, puts the target's own token
there and truncates the target cache to p, which is the invariant again; the draft cache
re-syncs by common prefix on its next draft.

Target-only decoding is the same loop with empty drafts (m = 0).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np

from fly_cpp import rows
from fly_cpp.accept import AcceptPolicy, Verdict, entropy_needed, judge
from fly_cpp.drafters import Drafter, sync
from fly_cpp.output import Output
from fly_cpp.sampling import Sampler, rejection_verify
from fly_cpp.step import Step

if TYPE_CHECKING:
    from fly_cpp._llama import Context, Model
    from fly_cpp.engine import Generation


@dataclass
class Pending:
    """A mismatch kept provisionally: where it sits, what the target wanted there, how many
    exact matches its window still needs, and the round that kept it."""

    pos: int
    correction: int
    left: int
    round: int


def run(gen: Generation, target: Context, model: Model, drafter: Drafter | None) -> Iterator[Step]:
    spec, stats = gen.spec, gen.stats
    policy = AcceptPolicy(spec.window, spec.entropy_threshold) if spec.mode == "fly" else AcceptPolicy.exact()
    cross_round = spec.cross_round and spec.mode == "fly"
    sampler = Sampler(gen.sampling, gen.seed)
    out = Output(model.piece, gen.stop, gen.max_tokens, stats)
    committed = list(gen.prompt)
    pending: Pending | None = None
    hits = misses = 0  # drafted tokens matched / rounds ended by a mismatch: the draft's agreement

    def max_left() -> int | None:
        """The longest unfinished window worth keeping provisionally: with running agreement p
        a window needing n more exact matches completes with probability about p**n."""
        p = (hits + 1) / (hits + misses + 2)
        confidence = spec.cross_round_confidence
        return None if confidence <= 0 else int(math.log(confidence) / math.log(p))

    def refute() -> None:
        nonlocal pending
        assert pending is not None
        del committed[pending.pos:]
        committed.append(pending.correction)
        target.truncate(pending.pos)
        out.refute()
        stats.n_refuted += 1
        stats.n_refuted_rounds += stats.n_rounds - pending.round
        round_, pending = pending.round, None
        if model.is_eog(committed[-1]):
            out.finish("stop")
        else:
            out.add(committed[-1], drafted=False, loose=False, round=round_)

    begin = perf_counter()
    sync(target, committed)
    start = perf_counter()
    stats.prompt_seconds = start - begin
    paused = 0.0  # time spent by the consumer between our yields, not ours to count
    try:
        while out.finish_reason is None:
            room = target.n_ctx - len(committed)  # drafted tokens that still fit the cache
            if room < 0:
                if pending is not None:
                    refute()
                    continue
                gen.context_full = True
                out.finish("length")
                break
            assert len(target.tokens) == len(committed) - 1 and target.tokens[-8:] == committed[-9:-1]
            left = pending.left if pending is not None else 0
            # a round verifies at most k drafts, in one batch, within the cache and the token budget
            limit = min(spec.k, room, target.n_batch - 1,
                        max(gen.max_tokens - stats.n_tokens - len(out.held) - 1, left))
            t0 = perf_counter()
            drafted = drafter.draft(committed, limit) if drafter is not None and limit > 0 else []
            if pending is not None and not drafted:  # nothing left to complete the window with
                refute()
                continue
            t1 = perf_counter()
            logits = target.decode([committed[-1], *drafted], logits="all")  # (m+1, n_vocab) view
            t2 = perf_counter()
            verdict, chosen = _judge(logits, drafted, committed, policy, sampler, cross_round, left,
                                     max_left() if cross_round else None)
            stats.draft_seconds += t1 - t0
            stats.target_seconds += t2 - t1
            stats.n_rounds += 1
            stats.n_drafted += len(drafted)

            if verdict.refuted_at is not None:
                refute()
                stats.accepted_lengths.append(1)
            else:
                target.truncate(len(committed) + verdict.accepted)
                hits += verdict.n_exact
                misses += verdict.accepted < len(drafted)
                stats.n_exact += verdict.n_exact
                stats.n_loose += len(verdict.loose)
                stats.n_gate_rejected += verdict.gate_rejected
                stats.accepted_lengths.append(verdict.accepted + 1)
                if verdict.confirmed:
                    out.confirm()
                    stats.n_confirmed += 1
                    stats.n_loose += 1
                    pending = None
                base = len(committed)
                if verdict.provisional is not None:
                    assert chosen is not None
                    pending = Pending(base + verdict.provisional, int(chosen[verdict.provisional]),
                                      verdict.window_left, stats.n_rounds)
                    stats.n_provisional += 1
                elif pending is not None:
                    pending.left = verdict.window_left
                for i, token in enumerate([*drafted[: verdict.accepted], verdict.next_token]):
                    held = pending is not None and base + i >= pending.pos
                    if model.is_eog(token):
                        if held:  # a window cannot be completed past the end of the text
                            refute()
                        else:
                            out.finish("stop")
                        break
                    committed.append(token)
                    loose = i in verdict.loose or (pending is not None and base + i == pending.pos)
                    out.add(token, drafted=i < verdict.accepted, loose=loose, round=stats.n_rounds, hold=held)
                    if out.finish_reason is not None:
                        break
            t3 = perf_counter()
            for step in out.take():
                yield step
            paused += perf_counter() - t3
        for step in out.take():
            yield step
    finally:
        gen.finish_reason = out.finish_reason
        stats.seconds = perf_counter() - start - paused


def _judge(logits: np.ndarray, drafted: list[int], committed: list[int], policy: AcceptPolicy, sampler: Sampler,
           cross_round: bool, window_left: int, max_left: int | None) -> tuple[Verdict, np.ndarray | None]:
    """Turn one round's logits into a verdict; also returns the target's chosen token per row
    (argmax or first draw; None for lossless rejection sampling)."""
    m = len(drafted)
    draft_ids = np.asarray(drafted, dtype=np.int64)  # (m,)

    def history(i: int) -> list[int]:
        return committed + drafted[:i]

    if sampler.settings.greedy:
        chosen = sampler.greedy(logits, history)  # (m+1,)
        need = np.flatnonzero(entropy_needed(draft_ids, chosen, policy, cross_round=cross_round,
                                             window_left=window_left))
        entropy = None
        if need.size:
            entropy = np.zeros(m)
            # contiguous row slices are views of llama.cpp's buffer; fancy indexing would copy them
            for i in need:
                entropy[i] = rows.top_entropy(logits[i : i + 1])[0]
        verdict = judge(draft_ids, chosen, entropy, policy, cross_round=cross_round, window_left=window_left,
                        max_left=max_left)
        return verdict, chosen
    if policy.window >= 1 and math.isfinite(policy.entropy_threshold):  # the authors' sampled rule
        chosen = np.array([sampler.sample(logits[i], history(i)) for i in range(m + 1)])
        second = np.array([sampler.sample(logits[i], history(i)) for i in range(m)])
        verdict = judge(draft_ids, chosen, rows.top_entropy(logits[:m]), policy, second,
                        cross_round=cross_round, window_left=window_left, max_left=max_left)
        return verdict, chosen
    n, token = rejection_verify(drafted, lambda i: sampler.distribution(logits[i], history(i)), sampler)
    return Verdict(accepted=n, loose=(), next_token=token, gate_rejected=False), None

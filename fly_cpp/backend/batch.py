"""Several sequences of one context decoded in shared batches: the jobs parked by the step loop's
tasks (``Job``), the ``Batcher`` that decodes them together, and each sequence's view (``Seq``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fly_cpp.backend import native
from fly_cpp.backend import rollback as rb
from fly_cpp.backend.cache import Cache, chunks, decode_failed
from fly_cpp.backend.lib import BATCH_MATCHES, ll, run_entry_points
from fly_cpp.backend.rows import argmax as _argmax
from fly_cpp.basics.errors import FlyError

if TYPE_CHECKING:
    from fly_cpp.backend.context import Context


class Job:
    """One sequence's tokens waiting for a shared decode; ``rows`` its logits once done.
    ``run``: a greedy run instead (``Seq.greedy_run``: at most that many tokens, ``stop`` its
    end marks), its tokens in ``got``; ``glet``: the task that waits for it."""

    __slots__ = ("seq", "pos", "tokens", "want", "rows", "error", "glet", "run", "stop", "got")

    def __init__(self, seq: int, pos: int, tokens: Sequence[int], want: int, run: int = 0,
                 stop: np.ndarray | None = None) -> None:
        self.seq, self.pos, self.tokens, self.want = seq, pos, tokens, want
        self.run, self.stop = run, stop
        self.rows: np.ndarray | None = None
        self.got: list[int] = []
        self.error: BaseException | None = None
        self.glet: Any = None

    @property
    def size(self) -> int:
        """Rows this job puts in the next batch."""
        return 1 if self.run else len(self.tokens)


class Parking(Protocol):
    """How a decode inside a step loop's task waits for the shared batch: the loop that takes a
    batcher gives it its own (``Batcher.serve``; ``fly_cpp.engine.scheduler``'s)."""

    def in_task(self) -> bool: ...  # whether the caller is a task of the loop (a decode then parks)
    def alone(self) -> bool: ...  # whether the caller's task is the only one the loop runs now
    def current(self) -> Any: ...  # the calling task (what the loop resumes once its decode is done)
    def park(self) -> None: ...  # hand the thread back to the loop until it resumes the caller


class _NoLoop:
    """No step loop: every decode runs at once."""

    def in_task(self) -> bool:
        return False

    def alone(self) -> bool:
        return False

    def current(self) -> Any:
        return None

    def park(self) -> None:
        raise RuntimeError("no step loop to park in")


class Batcher:
    """Decodes for several sequences of one context in shared batches. A sequence's decode,
    inside a task of the engine's step loop (the one it ``serve``s), parks its job here until
    the loop ``flush``es every parked job that fits one batch in ONE llama_decode (the slots'
    verification rows share the batch, and a long prompt, asked for in n_batch chunks,
    interleaves with the other slots' rounds); outside a task it decodes at once. A step whose
    jobs are all greedy runs decodes them inside the native library for several tokens at once
    (``native.greedy_runs``). Only the step thread touches the context, so a sequence's cache
    edits and state copies happen between decodes by construction."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.jobs: list[Job] = []
        self.decodes = 0  # llama_decode calls, and the rows they held (how wide the shared batches ran)
        self.rows = 0
        self.shared = 0  # shared decodes (one per batch: a llama_decode per sequence at n_ubatch 1)
        self.seqs = 0  # ... and the sequences they held
        self._runs: tuple[int, ...] | None = None  # what native runs need, once looked up
        self.parking: Parking = _NoLoop()

    def serve(self, parking: Parking) -> None:
        """From now on the decodes of ``parking``'s tasks park until the loop flushes them."""
        self.parking = parking

    def seq(self, seq_id: int) -> Seq:
        """Sequence ``seq_id``'s view of the context (made with ``n_seq`` > 1)."""
        if self.ctx.n_seq < 2 or not 0 <= seq_id < self.ctx.n_seq:
            raise ValueError(f"sequence {seq_id} outside this context's {self.ctx.n_seq}")
        return Seq(self.ctx, self, seq_id)

    @property
    def sharing(self) -> tuple[int, int, int]:
        """(shared decodes, the sequences and the rows they held, in all) since it was made."""
        return self.shared, self.seqs, self.rows

    def waiting(self) -> list[Job]:
        return self.jobs

    def decode(self, job: Job) -> None:
        """Decode ``job`` (with the other slots' jobs, inside a task); its ``rows`` / ``got``
        are set after, or its error raised."""
        if not self.parking.in_task():
            self._run([job])
        else:
            job.glet = self.parking.current()
            self.jobs.append(job)
            try:
                self.parking.park()
            finally:
                if job in self.jobs:  # cancelled while it waited: never decoded
                    self.jobs.remove(job)
        if job.error is not None:
            raise job.error

    def flush(self, halt: np.ndarray | None = None) -> list[Job]:
        """Decode the parked jobs that fit one batch (in the order they came); the jobs done.
        Greedy runs decoded together end early once ``halt[0]`` is set ((1,) int32: the loop
        has news, a task to admit or to cancel)."""
        take, room = [], self.ctx.n_batch
        for j in self.jobs:
            if j.size <= room:
                take.append(j)
                room -= j.size
        taken = set(map(id, take))
        self.jobs = [j for j in self.jobs if id(j) not in taken]
        if take:
            try:
                self._run(take, halt)
            except Exception as e:  # each job's task raises it where it waits
                for j in take:
                    j.error = j.error or e
        return take

    def _run(self, jobs: list[Job], halt: np.ndarray | None = None) -> None:
        # llama.cpp's split for a cache per sequence (split_equal) puts several sequences in one
        # micro-batch only while their ids follow one another in the batch (else it reads the
        # weights once per run of ids), hence the order; and it puts one row of each of two
        # sequences together even at n_ubatch 1, whose promise (a row's numbers independent of
        # its batch) then needs a llama_decode per sequence
        jobs = sorted(jobs, key=lambda j: j.seq)
        separate = self.ctx.n_ubatch == 1 and len(jobs) > 1
        if all(j.run for j in jobs) and self._native_runs():
            self._run_natively(jobs, separate, halt)
            return
        for group in ([[j] for j in jobs] if separate else [jobs]):
            self._run_one(group)
        self.shared += 1
        self.seqs += len(jobs)

    def _native_runs(self) -> bool:
        if self._runs is None:
            ok = BATCH_MATCHES and native.has_greedy_runs() and not self.ctx.model.call.endpoints
            self._runs = (*run_entry_points(),) if ok else ()
        return bool(self._runs)

    def _run_natively(self, jobs: list[Job], separate: bool, halt: np.ndarray | None) -> None:
        ctx = self.ctx
        decode, logits = self._runs  # type: ignore[misc]
        stop = jobs[0].stop
        got, status = native.greedy_runs(
            decode, logits, ctx.ptr, ctypes.addressof(ctx._batch), np.array([j.tokens[0] for j in jobs], np.int32),
            np.array([j.pos for j in jobs], np.int32), np.array([j.seq for j in jobs], np.int32),
            np.array([j.run for j in jobs], np.int64), separate, ctx.model.n_vocab, stop, halt)
        steps = max(map(len, got), default=0)
        self.decodes += steps * (len(jobs) if separate else 1)
        self.rows += sum(map(len, got))
        self.shared += steps
        self.seqs += sum(map(len, got))
        evicted = self._evict(jobs) if status == 1 and len(jobs) > 1 else None
        for j, tokens in zip(jobs, got):
            j.got = tokens
            if status != 0 and len(tokens) < j.run and not (tokens and stop is not None and stop[tokens[-1]]):
                # a run that the failed decode cut: what it left past its tokens is dropped
                ctx._call(ll.llama_memory_seq_rm, ctx._memory, j.seq, j.pos + len(tokens), -1)
                if evicted is None:  # else a shorter run beside the sequence that gave way (its own error set)
                    j.error = decode_failed(ctx.model.name, status, {-1: "no logits"})

    def _evict(self, jobs: list[Job]) -> Job:
        """The job of the sequence holding the most of a full shared cache: it fails (its
        generation ends as a full context ends, ``CacheFull``) and its cells are freed now, so
        that the others go on (llama-server ends every slot there). Its caller's ``Seq`` holds
        nothing after (the generation's end empties it)."""
        ctx = self.ctx
        evicted = max(jobs, key=lambda j: j.pos + len(j.tokens))
        ctx._call(ll.llama_memory_seq_rm, ctx._memory, evicted.seq, 0, -1)
        evicted.error = decode_failed(ctx.model.name, 1)
        return evicted

    def _run_one(self, jobs: list[Job]) -> None:
        ctx, i = self.ctx, 0
        for j in jobs:
            i = ctx.fill_batch(i, j.tokens[:1] if j.run else j.tokens, j.pos, j.seq, 1 if j.run else j.want)
        rc = ctx._call(ll.llama_decode, ctx.ptr, ctx._batch)
        self.decodes += 1
        self.rows += i
        if rc != 0:
            for j in jobs:  # a failed decode may leave part of the batch behind
                ctx._call(ll.llama_memory_seq_rm, ctx._memory, j.seq, j.pos, -1)
            if rc == 1 and len(jobs) > 1:  # the shared cache is full: the largest sequence gives way
                evicted = self._evict(jobs)
                self._run_one([j for j in jobs if j is not evicted])
                return
            for j in jobs:
                j.error = decode_failed(ctx.model.name, rc)
            return
        n_out = sum(1 if j.run else j.want for j in jobs)
        # (n_out, n_vocab): the rows with logits in batch order; each sequence keeps a copy, since
        # the next shared decode overwrites the buffer before its owner may have read it
        out = ctx._rows(n_out)
        at = 0
        for j in jobs:
            if j.run:  # one token of its run in this batch
                j.got = [int(_argmax(out[at:at + 1])[0])]
                at += 1
            else:
                j.rows = out[at:at + j.want].copy()
                at += j.want


class Seq(Cache):
    """One sequence of a context shared by several (``Context(n_seq=N)``), with the part of
    ``Context``'s interface the speculative loop and the draft model use: ``tokens`` (position
    p of this sequence holds ``tokens[p]``), ``decode``, ``truncate``, ``sync``,
    ``checkpoint``, ``greedy_run``. Its decodes are shared ones (``Batcher``); a recurrent
    state goes back by checkpoints of this sequence's own, taken and restored between decodes,
    and a checkpoint asked for inside a decode splits this sequence's part of it in two shared
    decodes (the catch-up, then the rows), the copy taken between them."""

    def __init__(self, ctx: Context, shared: Batcher, seq_id: int) -> None:
        self.ctx, self.shared, self.seq_id = ctx, shared, seq_id
        self.model, self.n_batch, self.n_ubatch, self.n_threads = ctx.model, ctx.n_batch, ctx.n_ubatch, ctx.n_threads
        self.n_outputs = ctx.n_outputs
        self.n_ctx = ctx.n_ctx if ctx.kv_unified else ctx.n_ctx // ctx.n_seq  # the cells this sequence may hold
        self.ptr, self._memory, self._call = ctx.ptr, ctx._memory, ctx._call
        self.n_rs_seq = 0
        self._track(ctx.rollback)
        self._out: np.ndarray | None = None  # the last decode's rows with logits (this sequence's copy)

    def _decode_range(self, end: int, want: int) -> None:
        """As ``Context``'s, each n_batch chunk one shared decode (other sequences' rounds run
        between them)."""
        for lo, hi in chunks(self._done, end, self.n_batch):
            job = Job(self.seq_id, lo, self.tokens[lo:hi], want if hi == end else 0)
            try:
                self.shared.decode(job)
            except FlyError:
                self._physical(lo, failed=True)  # the batcher dropped what the failed decode left of a KV cache
                raise
            self._out = job.rows
            self._done = hi

    def _rows(self, want: int) -> np.ndarray:
        assert self._out is not None and len(self._out) == want
        return self._out

    @property
    def runs_natively(self) -> bool:
        """Whether ``greedy_run`` decodes here in runs: a plain KV cache on this machine (no rpc
        servers); the runs of every slot that runs one go together (``Batcher``)."""
        return (self.rollback == rb.KV and not self.model.call.endpoints and BATCH_MATCHES
                and native.has_greedy_runs())

    @property
    def drafts_natively(self) -> bool:
        """Whether ``draft_run`` drafts here: as for runs, and only while this sequence's task is
        the only one of the step loop (else its drafting steps share the draft model's batches
        with the other slots' steps)."""
        return self.runs_natively and native.has_draft_run() and self.shared.parking.alone()

    def draft_run(self, hist: np.ndarray, n_hist: int, rules: native.DraftRules, n_vocab: int,
                  text: Sequence[int] | None = None) -> tuple[list[int], list[float], int]:
        """``Context.draft_run`` on this sequence (at once: nothing else decodes meanwhile)."""
        return self.ctx.draft_run(hist, n_hist, rules, n_vocab, self, text)

    def greedy_run(self, token: int, n: int, stop: np.ndarray | None) -> list[int]:
        """As ``Context.greedy_run``, one row of this sequence in each of the shared decodes
        (inside the native library while every running slot runs: ``Batcher``). It may return
        fewer than ``n`` tokens: a step shared with other slots' rounds decodes one."""
        start = len(self.tokens)
        n = min(n, self.n_ctx - start)
        if n <= 0 or self.behind or self._intent is not None:
            raise FlyError(f"no room for a greedy run at {start} of n_ctx={self.n_ctx}")
        job = Job(self.seq_id, start, [token], 0, run=n, stop=stop)
        try:
            self.shared.decode(job)
        except FlyError:
            self.tokens.extend([token, *job.got[:-1]] if job.got else [])
            self._physical(start + len(job.got), failed=True)
            raise
        got = job.got
        self.tokens.extend([token, *got[:-1]] if got else [])
        self._done = len(self.tokens)
        return got

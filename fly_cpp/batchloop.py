"""Several sequences at once: an engine made with ``n_seq`` N > 1 has N slots, each a sequence
of the target's context and of the draft's (one unified KV cache per model, ``Context.seq``).

A slot runs the speculative loop (``fly_cpp.loop``) unchanged, so FLy's rule, the cross-round
window, sampling and stops stay per sequence. What the slots share is the decode: a context's
``_Batcher`` gathers every decode the running slots ask for while one runs into the next
llama_decode. A decode being most of a round, the slots fall into step: their verification
rows share one target batch and their drafting steps shared draft batches, and each slot keeps
and rolls back its own sequence; a slot that is still busy when a decode starts joins the next,
so none waits for another's round. A new request's
prompt goes in n_batch chunks, each one shared decode, so the other slots' rounds go on between
them.

Drafting under load (``Throttled``): while more than one slot is active, the slots' rounds
can draft together (``Rounds``), as llama-server's slots do: the slots that come to draft form
a round, each drafts up to its k (a fixed k always; k auto up to ``SpecSettings.k_slots``, and
only where ``worth.together`` prices it well ahead of drafting nothing) with every step of every
slot in one draft-model decode, and their verification rows then go in one target decode. Each
slot keeps and rolls back its own sequence, as alone. Drafting alone, slot by slot, fell out
of step under load: each slot's draft steps were decodes of their own and the target's batches
shrank to 1.4-1.6 slots (docs/slots.md). With ``k_slots`` 0 (or a drafter without a draft
model) rounds under load draft only what an open cross-round window needs. k auto learns
nothing from shared decodes (``Pacer.sharing``): their timings are every slot's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from time import perf_counter

from fly_cpp import worth
from fly_cpp._llama import Context, Seq, common_prefix
from fly_cpp.draft_model import ModelDrafter
from fly_cpp.drafters import Draft, Drafter, Report, shift_drafter
from fly_cpp.paced import PacedDrafter
from fly_cpp.pacer import Pacer


class Slots:
    """The N sequence views of the engine's contexts, which are busy, and how many run."""

    def __init__(self, target: Context, draft: Context | None, n: int) -> None:
        self.n = n
        self.targets: list[Seq] = [target.seq(i) for i in range(n)]
        self.drafts: list[Seq] | None = [draft.seq(i) for i in range(n)] if draft is not None else None
        self.busy = [False] * n
        self._count = threading.Condition()
        self.rounds = Rounds(self) if draft is not None else None

    @contextmanager
    def take(self, slot: int | None, prompt: Sequence[int] = ()) -> Iterator[int]:
        """Hold ``slot`` (None: the free one whose cache shares most with ``prompt``, as
        llama-server picks, else wait for any) while a generation runs in it."""
        with self._count:
            while True:
                free = [i for i in ([slot] if slot is not None else range(self.n)) if not self.busy[i]]
                if free:
                    at = max(free, key=lambda i: (common_prefix(self.targets[i].tokens, prompt), -i))
                    break
                self._count.wait()
            self.busy[at] = True
        try:
            yield at
        finally:
            with self._count:
                self.busy[at] = False
                self._count.notify_all()

    @property
    def active(self) -> int:
        """Slots generating now."""
        return sum(self.busy)

    def wait_idle(self) -> None:
        """Return once no slot is generating (closing the engine waits for the running ones)."""
        with self._count:
            while any(self.busy):
                self._count.wait()


class Rounds:
    """The slots' rounds drafted together. A slot that comes to draft waits until the round
    forms: every slot of the last round that still generates has come (each slot's host work
    after the shared verification is short beside a decode), or ``WAIT`` has passed. The round's
    slots then hold the draft context's decodes for one another at every step until each is
    done drafting (``_Batcher.expect``), and the target's next decode until each has sent its
    rows, so that every decode of the round is one for all of them."""

    WAIT = 0.05  # seconds a round waits for a slot of the last one (it ended, or its reader is slow)

    def __init__(self, slots: Slots) -> None:
        assert slots.drafts is not None
        self.slots = slots
        self.target, self.draft = slots.targets[0].shared, slots.drafts[0].shared
        self.cond = threading.Condition()
        self.come: set[int] = set()  # slots waiting for this round to form
        self.members: set[int] = set()  # the last round's slots
        self.formed = 0  # rounds formed so far
        self.until: float | None = None
        self.threads: dict[int, int] = {}  # the thread each slot last drafted in

    @contextmanager
    def join(self, slot: int) -> Iterator[None]:
        """Draft in the next round (inside the block); the block's end says this slot drafts no more."""
        me = threading.get_ident()
        self.target.release(self.slots.targets[slot].seq_id)  # a last round that sent no rows (a refuted window) is not awaited
        with self.cond:
            self.come.add(slot)
            self.threads[slot] = me
            self.cond.notify_all()
            mine = self.formed
            while self.formed == mine:
                # a slot whose generation this thread also runs cannot come while it waits
                awaited = {s for s in self.members if self.slots.busy[s] and self.threads.get(s) != me} - self.come
                now = perf_counter()
                if self.until is None:
                    self.until = now + self.WAIT
                if not awaited or now >= self.until:
                    self._form()
                    break
                self.cond.wait(self.until - now)
        try:
            yield
        except BaseException:
            self.target.release(self.slots.targets[slot].seq_id)  # no rows come from it
            raise
        finally:
            self.draft.release(self.slots.drafts[slot].seq_id)

    def leave(self, slot: int) -> None:
        """``slot``'s round does not draft: the next round does not wait for it."""
        with self.cond:
            if slot in self.members:
                self.members.discard(slot)
                self.cond.notify_all()

    def _form(self) -> None:
        members, self.come = self.come, set()
        self.members, self.until = members, None
        self.formed += 1
        self.draft.expect((self.slots.drafts[s].seq_id for s in members), every=True)
        self.target.expect((self.slots.targets[s].seq_id for s in members), every=False)
        self.cond.notify_all()


class Throttled:
    """A slot's drafter: while other slots are active, its rounds drafted with theirs
    (``Rounds``; up to ``k``), else cut to what an open window needs (and k auto's pacer,
    ``pacer``, told that its rounds share their decodes)."""

    def __init__(self, inner: Drafter, slots: Slots, pacer: Pacer | None, slot: int = 0, k: int = 0) -> None:
        self.inner, self.slots, self.pacer, self.slot = inner, slots, pacer, slot
        model = inner.inner if isinstance(inner, PacedDrafter) else inner
        # drafting together needs the draft model (one decode a step for every slot)
        self.together = model if isinstance(model, ModelDrafter) and k > 0 and slots.rounds is not None else None
        self.k = k
        self.drafted_together = False  # the last round was

    def begin(self, prompt: Sequence[int]) -> None:
        """The draft's prompt is decoded now while this slot runs alone, or where its rounds
        draft together with the others' (so that a round's first step does not carry it); else
        beside other slots rounds seldom draft, and a draft that comes catches up then."""
        active = self.slots.active
        if active <= 1 or (self.together is not None and self._k(active) > 0):
            self.inner.begin(prompt)

    def draft(self, committed: Sequence[int], limit: int, need: int = 0) -> Draft:
        active = self.slots.active
        if self.pacer is not None:
            self.pacer.sharing = active
        self.drafted_together = False
        if active <= 1:
            return self.inner.draft(committed, limit, need)
        rounds = self.slots.rounds
        if self.together is not None and (k := self._k(active)) > 0:
            assert rounds is not None  # ``together`` is set only where slots have rounds
            self.drafted_together = True
            with rounds.join(self.slot):
                return self.together.draft(committed, min(limit, max(k, need)), need)
        if rounds is not None:
            rounds.leave(self.slot)
        limit = min(limit, need)
        if limit <= 0:
            return Draft()
        return self.inner.draft(committed, limit, need)

    def _k(self, active: int) -> int:
        """The draft length of this round drafted together: as set for a fixed k; with k auto,
        up to ``k_slots`` as priced for ``active`` slots sharing its decodes (``worth.together``)."""
        if self.pacer is None:
            return self.k
        return worth.together(self.pacer.costs, self.pacer.model.mean(), active, self.k)

    def candidate(self, committed: Sequence[int]) -> int | None:
        return self.inner.candidate(committed)

    def shift(self, keep: int, drop: int) -> None:
        shift_drafter(self.inner, keep, drop)

    def accept(self, report: Report) -> None:
        if not self.drafted_together:  # k auto planned no round drafted together, nor learns from one
            self.inner.accept(report)

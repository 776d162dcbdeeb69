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

Drafting under load (``Throttled``): while more than one slot is active, rounds draft only
what an open cross-round window needs to be judged; alone, a slot drafts as it always does.
Pricing a round as the slots run it, in step (each slot's draft steps and rows in shared
decodes), was measured on the F16 pair with chat prompts and gained nothing over this rule
(docs/slots.md). k auto learns nothing about costs from shared decodes
(``Pacer.sharing``): their timings are every slot's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from fly_cpp._llama import Context, Seq, common_prefix
from fly_cpp.drafters import Draft, Drafter, Report, shift_drafter
from fly_cpp.pacer import Pacer


class Slots:
    """The N sequence views of the engine's contexts, which are busy, and how many run."""

    def __init__(self, target: Context, draft: Context | None, n: int) -> None:
        self.n = n
        self.targets: list[Seq] = [target.seq(i) for i in range(n)]
        self.drafts: list[Seq] | None = [draft.seq(i) for i in range(n)] if draft is not None else None
        self.busy = [False] * n
        self._count = threading.Condition()

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


class Throttled:
    """A slot's drafter: while other slots are active, cut to what an open window needs (and k
    auto's pacer, ``pacer``, told that its rounds share their decodes)."""

    def __init__(self, inner: Drafter, slots: Slots, pacer: Pacer | None) -> None:
        self.inner, self.slots, self.pacer = inner, slots, pacer

    def begin(self, prompt: Sequence[int]) -> None:
        """The draft's prompt is decoded now only while this slot runs alone: beside other
        slots its rounds seldom draft, and a draft that comes catches up then."""
        if self.slots.active <= 1:
            self.inner.begin(prompt)

    def draft(self, committed: Sequence[int], limit: int, need: int = 0) -> Draft:
        active = self.slots.active
        if self.pacer is not None:
            self.pacer.sharing = active
        if active > 1:
            limit = min(limit, need)
            if limit <= 0:
                return Draft()
        return self.inner.draft(committed, limit, need)

    def candidate(self, committed: Sequence[int]) -> int | None:
        return self.inner.candidate(committed)

    def shift(self, keep: int, drop: int) -> None:
        shift_drafter(self.inner, keep, drop)

    def accept(self, report: Report) -> None:
        self.inner.accept(report)

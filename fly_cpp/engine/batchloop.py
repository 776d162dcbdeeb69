"""A slot's drafting under load: an engine made with ``n_seq`` N > 1 has N slots, each a
sequence of the target's context and of the draft's (``backend.batch.Batcher.seq``), advanced together by the
engine's step loop (``fly_cpp.engine.scheduler``). Each slot runs the speculative loop
(``fly_cpp.rounds.loop``) unchanged, so FLy's rule, the cross-round window, sampling and stops stay per
sequence; the loop decodes every slot's drafting steps in shared draft batches and every slot's
verification rows in one target batch.

``Throttled`` is how far a slot drafts while other slots are active: a fixed k as set, as
llama-server's slots draft; k auto up to ``SpecSettings.k_slots``, only where
``worth.together`` prices the shared rounds well ahead of drafting nothing. Otherwise its rounds
under load draft only what an open cross-round window needs, and where nothing is needed they
are left to the target alone (``Draft.alone``), decoded in greedy runs with the other slots'
runs where verification is exact. k auto learns nothing from shared decodes
(``Pacer.sharing``): their timings are every slot's.
"""

from __future__ import annotations

from collections.abc import Sequence

from fly_cpp.drafters.drafter import PairDrafter
from fly_cpp.drafters.seam import Draft, Drafter, Report
from fly_cpp.engine.scheduler import Scheduler
from fly_cpp.kauto.pacer import Pacer
from fly_cpp.rounds.runs import MAX_RUN

# rounds a slot under load that drafts nothing leaves to the target alone: as many as a run takes (its
# length follows the time a run may decode, ``fly_cpp.rounds.runs``); a run of every slot ends anyway when
# one slot ends or a request comes, and the slot is asked again after each run (16 cut the runs
# short: the defaults at -np 4 ran 0.90x target mode on the bundled pair)
LOAD_RUN = MAX_RUN


class Throttled:
    """A slot's drafter: while other slots are active, its rounds drafted with ``model`` (the
    pair's drafter with the draft model, at a fixed k: ``PairDrafter.fixed``) up to ``k`` in step
    with theirs, else cut to what an open window needs, else left to the target alone; k auto's
    ``pacer`` is told that its rounds share their decodes and prices the shared round."""

    def __init__(self, inner: Drafter, steps: Scheduler, pacer: Pacer | None, model: PairDrafter | None,
                 k: int = 0) -> None:
        self.inner, self.steps, self.pacer = inner, steps, pacer
        self.together = model if k > 0 else None  # drafting under load needs the draft model: a shared decode a step
        self.k = k
        self.planned = False  # the last round's plan was this drafter's own (the inner one learns nothing of it)

    def begin(self, prompt: Sequence[int]) -> None:
        """The draft's prompt is decoded now while this slot runs alone, or where its rounds
        draft under load too (so that a round's first step does not carry it); else beside
        other slots rounds seldom draft, and a draft that comes catches up then."""
        active = self.steps.active
        if active <= 1 or (self.together is not None and self._k(active) > 0):
            self.inner.begin(prompt)

    def draft(self, committed: Sequence[int], limit: int, need: int = 0) -> Draft:
        active = self.steps.active
        if self.pacer is not None:
            self.pacer.share(active)
        self.planned = False
        if active <= 1:
            return self.inner.draft(committed, limit, need)
        if self.together is not None and (k := self._k(active)) > 0:
            self.planned = True
            return self.together.fixed(committed, min(limit, max(k, need)), need)
        if min(limit, need) <= 0:  # the target alone, in runs where it can (``fly_cpp.rounds.runs``) until asked again
            self.planned = True
            return Draft(alone=LOAD_RUN)
        return self.inner.draft(committed, min(limit, need), need)

    def _k(self, active: int) -> int:
        """The draft length of a round under load: as set for a fixed k; with k auto, up to
        ``k_slots`` as priced for ``active`` slots sharing its decodes."""
        return self.k if self.pacer is None else self.pacer.together(active, self.k)

    def candidate(self, committed: Sequence[int]) -> int | None:
        return self.inner.candidate(committed)

    def shift(self, keep: int, drop: int) -> None:
        self.inner.shift(keep, drop)

    def accept(self, report: Report) -> None:
        if not self.planned:  # k auto planned no round under load, nor learns from one
            self.inner.accept(report)

"""Shared by the slot tests (``tests/test_batchloop.py``, ``tests/test_hybrid_slots.py``): run
generations in slots at once, and cancel one of them while the others go on. Greedy unless told
otherwise: a slot's text is then the one it writes alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from fly_cpp import Engine, SamplingSettings, SpecSettings

GREEDY = SamplingSettings(temperature=0)


class Gate:
    """A drafter that holds the step loop in its first round until ``open``: the generation it
    drafts for is then surely running (a generation runs ahead of its reader). It drafts
    nothing."""

    def __init__(self) -> None:
        self._came, self._open = threading.Event(), threading.Event()

    def draft(self, committed: list[int], limit: int) -> list[int]:
        self._came.set()
        assert self._open.wait(60), "the gate was never opened"
        return []

    def wait_for_round(self) -> None:
        assert self._came.wait(60)

    def open(self) -> None:
        self._open.set()


def drive(its: list[Iterator[object]]) -> None:
    """Each iterator to its end, all at once in threads."""
    threads = [threading.Thread(target=lambda it=it: [None for _ in it]) for it in its]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def together(engine: Engine, spec: SpecSettings, prompts: list[str], max_tokens: int,
             sampling: SamplingSettings = GREEDY) -> list:
    """Every prompt in its own slot (0, 1, ...) at once; each finished generation."""
    gens = [engine.generate(p, spec=spec, sampling=sampling, max_tokens=max_tokens, slot=i)
            for i, p in enumerate(prompts)]
    drive([iter(g) for g in gens])
    return gens


def check_a_cancelled_slot(alone: Engine, slots: Engine, spec: SpecSettings, prompts: list[str],
                           max_tokens: int, sampling: SamplingSettings = GREEDY) -> None:
    """Slot 0 runs ``prompts[0]`` one step and is closed (a cancelled client) while slots 1.. run
    the others: those return what they return alone, and slot 0's next request is unharmed."""
    def alone_tokens(p: str) -> list[int]:
        return alone.generate(p, spec=spec, sampling=sampling, max_tokens=max_tokens).run().tokens

    expected = [alone_tokens(p) for p in prompts[1:]]
    short = slots.generate(prompts[0], spec=spec, sampling=sampling, max_tokens=max_tokens, slot=0)
    gens = [slots.generate(p, spec=spec, sampling=sampling, max_tokens=max_tokens, slot=i + 1)
            for i, p in enumerate(prompts[1:])]
    its = [iter(g) for g in gens]
    next(iter(short))
    for it in its:
        next(it)
    short.close()  # its slot stops between rounds
    drive(its)
    assert [g.tokens for g in gens] == expected
    again = slots.generate(prompts[0], spec=spec, sampling=sampling, max_tokens=max_tokens, slot=0).run().tokens
    assert again == alone_tokens(prompts[0])

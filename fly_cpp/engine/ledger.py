"""What each slot of an engine is doing and has done, for ``/slots`` and ``/metrics``.

A generation is *waiting* from the moment it asks for a slot (a pinned slot that is busy, or
none free) until it holds one, then *running* in that slot until it ends. Each slot keeps the
Stats of the generation running in it, else of its last one (what llama-server shows of a
slot's current or previous task), and counters summed over every generation it has run, the
running one included, so that they only ever grow.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fly_cpp.rounds.step import Stats

# a slot's counters: name -> (what it counts, from a generation's Stats)
COUNTERS: dict[str, tuple[str, Callable[[Stats], int]]] = {
    "generations": ("generations run", lambda s: 1),
    "tokens_predicted": ("tokens generated", lambda s: s.n_tokens),
    "rounds": ("target forward passes (rounds)", lambda s: s.n_rounds),
    "drafts": ("rounds that verified a draft (llama-server's verification steps)", lambda s: s.n_drafts),
    "drafted": ("tokens drafted", lambda s: s.n_drafted),
    "accepted": ("drafted tokens the target kept (exactly or loosely)", lambda s: s.n_exact + s.n_loose),
    "loosely_accepted": ("drafted tokens kept by FLy's loose acceptance", lambda s: s.n_loose),
}


@dataclass
class SlotView:
    """One slot as the outer layers see it: a snapshot."""

    running: bool
    last: Stats | None  # the generation running here, else the last one (None: none yet)
    limit: int = 0  # that generation's max_tokens
    totals: dict[str, int] = field(default_factory=dict)


class Ledger:
    def __init__(self, n: int) -> None:
        self._lock = threading.Lock()
        self._running: list[Stats | None] = [None] * n
        self._last: list[Stats | None] = [None] * n
        self._limit = [0] * n
        self._done = [dict.fromkeys(COUNTERS, 0) for _ in range(n)]

    @contextmanager
    def run(self, at: int, stats: Stats, limit: int) -> Iterator[None]:
        """The generation counted by ``stats`` (``limit``: its max_tokens) runs in slot ``at``
        for the block."""
        with self._lock:
            self._running[at] = self._last[at] = stats
            self._limit[at] = limit
        try:
            yield
        finally:
            with self._lock:
                self._running[at] = None
                for name, (_, of) in COUNTERS.items():
                    self._done[at][name] += of(stats)

    @property
    def running(self) -> int:
        """Generations running now (in as many slots)."""
        with self._lock:
            return sum(s is not None for s in self._running)

    def view(self) -> list[SlotView]:
        with self._lock:
            out = []
            for running, last, limit, done in zip(self._running, self._last, self._limit, self._done):
                totals = dict(done)
                if running is not None:
                    for name, (_, of) in COUNTERS.items():
                        totals[name] += of(running)
                out.append(SlotView(running is not None, dataclasses.replace(last) if last is not None else None,
                                    limit, totals))
            return out

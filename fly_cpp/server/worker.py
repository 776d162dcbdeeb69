"""The threads that read the engine's generations for the event loop.

Generations run on the engine's step loop (``fly_cpp.engine.scheduler``); a worker thread per slot
reads one generation's items at a time, in arrival order, and hands them to the event loop
through an asyncio queue, so the event loop never blocks on the engine. Waiting requests queue
in front of the threads (at most ``max_queue``: beyond, HTTP 503 at once).

A consumer that stops early (the client went away) sets the job's cancel flag; the worker sees
it before the next item, closes the generation (its task ends where it next waits for a decode,
both KV caches consistent, its slot free) and takes the next job. A job still waiting when its client leaves closes at once
without generating.

Shutdown (``stop``) ends every job cleanly: the running one is interrupted (its generation ends
after the current round and its last items, the final chunk with the stop reason, still come),
and the waiting ones fail with ``ShuttingDown`` (HTTP 503, or a final error event) instead of
starting.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

T = TypeVar("T")
_ITEM, _ERROR, _END = "item", "error", "end"


class Unavailable(Exception):
    """The server cannot take this request now (HTTP 503)."""


class ShuttingDown(Unavailable):
    """A request that had not started when shutdown began."""


class QueueFull(Unavailable):
    """More requests wait for the engine than ``max_queue`` allows."""


class Worker:
    def __init__(self, max_queue: int = 128, slots: int = 1, waiting_inside: Callable[[], int] = lambda: 0) -> None:
        """``slots``: generations run at once, one thread each (the engine's slots, which
        share their decodes: ``fly_cpp.engine.batchloop``). ``waiting_inside``: how many started jobs
        wait inside the engine for a slot (they count against ``max_queue`` too)."""
        self.slots = slots
        self._waiting_inside = waiting_inside
        self._own: set[threading.Thread] = set()  # pinned jobs' threads
        self._pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="fly-cpp-engine")
        self._lock = threading.Lock()
        self._cancels: set[threading.Event] = set()
        self._interrupts: dict[int, Callable[[], None]] = {}  # the running job's, by job id
        self.max_queue = max_queue
        self.waiting = 0  # jobs queued, not started (the engine counts those running and waiting for a slot)
        self.closed = False

    def submit(self, make: Callable[[], Iterator[T]], interrupt: Callable[[], None] | None = None, *,
               pinned: bool = False) -> Job[T]:
        """Queue ``make()`` for the worker (or raise ``Unavailable`` at once); iterate the
        returned ``Job`` for its items as they come. ``interrupt``: how to end the job early but
        cleanly at shutdown (it then still yields its last items). A Job that is dropped
        without being read to its end abandons the work. ``pinned``: the job runs in one given
        slot; with several slots it starts at once on a thread of its own and waits inside the
        engine for that slot, so that it does not hold one of the N threads a request for a
        free slot needs meanwhile."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        cancel = threading.Event()

        # items on their way to the event loop: while one hand-off is pending, later items join it
        # (one wake-up of the loop for a burst of tokens; the order is kept)
        outbox: list[tuple[str, Any]] = []

        def deliver() -> None:  # on the event loop; copy and cut are each atomic, and an item
            while outbox:      # appended between them is taken by the next turn
                batch = outbox[:]
                del outbox[: len(batch)]
                for entry in batch:
                    items.put_nowait(entry)

        def post(kind: str, value: Any = None) -> None:
            outbox.append((kind, value))
            if len(outbox) > 1:
                return  # a hand-off is pending: it takes this item too
            try:
                loop.call_soon_threadsafe(deliver)
            except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
                cancel.set()

        def job() -> None:
            with self._lock:
                self.waiting -= 1
                if self.closed:
                    post(_ERROR, ShuttingDown("the server is shutting down; the request was not started"))
                    return
                if interrupt is not None:
                    self._interrupts[id(cancel)] = interrupt
            it = None
            try:
                if not cancel.is_set():
                    it = make()
                    for item in it:
                        post(_ITEM, item)
                        if cancel.is_set():
                            break
            except BaseException as e:  # handed to the consumer, raised there
                post(_ERROR, e)
            else:
                post(_END)
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
                with self._lock:
                    self._interrupts.pop(id(cancel), None)

        with self._lock:
            if self.closed:
                raise ShuttingDown("the server is shutting down")
            waiting = self.waiting + self._waiting_inside()
            if waiting >= self.max_queue:
                raise QueueFull(f"the server is busy: {waiting} requests are waiting for the engine "
                                f"(--max-queue {self.max_queue}); retry later")
            self.waiting += 1
            self._cancels.add(cancel)
        try:
            if pinned and self.slots > 1:
                self._start_own(job)
            else:
                self._pool.submit(job)
        except RuntimeError:
            with self._lock:
                self.waiting -= 1
                self._cancels.discard(cancel)
            raise ShuttingDown("the server is shutting down") from None
        return Job(items, cancel, lambda: self._forget(cancel))

    def _start_own(self, job: Callable[[], None]) -> None:
        def run() -> None:
            try:
                job()
            finally:
                with self._lock:
                    self._own.discard(thread)

        thread = threading.Thread(target=run, name="fly-cpp-engine-pinned", daemon=True)
        with self._lock:
            self._own.add(thread)
        thread.start()

    def _forget(self, cancel: threading.Event) -> None:
        # no lock: a Job's finalizer calls this wherever the garbage collector runs, also on a
        # thread that holds the lock (in ``submit``), which then waited for itself (a soak at -np 4
        # hung so); a set's discard is atomic
        self._cancels.discard(cancel)

    def stop(self) -> None:
        """Shutdown begins: take no more jobs, interrupt the running one (it ends with its
        final items) and fail the waiting ones when their turn comes (503)."""
        with self._lock:
            self.closed = True
            interrupts = list(self._interrupts.values())
        for interrupt in interrupts:
            interrupt()

    def close(self) -> None:
        """Stop; abandon what is still open (its consumers are gone), and wait for the thread."""
        self.stop()
        for cancel in list(self._cancels):  # a copy: finalizers discard from it on any thread
            cancel.set()
        self._pool.shutdown(wait=True)
        with self._lock:
            own = list(self._own)
        for thread in own:
            thread.join()


class Job(Generic[T]):
    """The event loop's end of one job: its items, then the end (or its error raised)."""

    def __init__(self, items: asyncio.Queue[tuple[str, Any]], cancel: threading.Event,
                 forget: Callable[[], None]) -> None:
        self._items = items
        self._done = False
        # however this end goes away (read to the end, closed, or simply dropped), the work stops
        self._finalizer = weakref.finalize(self, _abandon, cancel, forget)

    def __aiter__(self) -> Job[T]:
        return self

    async def __anext__(self) -> T:
        if self._done:
            raise StopAsyncIteration
        kind, value = await self._items.get()
        if kind == _ITEM:
            return value  # type: ignore[no-any-return]
        self.close()
        if kind == _ERROR:
            raise value
        raise StopAsyncIteration

    def close(self) -> None:
        """Stop reading: the worker abandons the job at its next item."""
        self._done = True
        self._finalizer()


def _abandon(cancel: threading.Event, forget: Callable[[], None]) -> None:
    cancel.set()
    forget()

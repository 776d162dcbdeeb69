"""One loop for every slot: the engine's step thread.

Everything that touches the models' contexts runs here, on one thread, as *tasks*: a
generation, a scoring pass, a prefill, a cost measurement. A task is a function of the slot it
runs in (its body, an iterator of items), started in a greenlet once its slot is free. Where
the task asks a context shared by several slots for a decode (``fly_cpp.backend.batch.Seq``), its
greenlet parks the request with that context's batcher and switches back here; the loop then
advances every slot by one step, as llama-server's ``update_slots`` does:

1. admit waiting tasks into free slots (a pinned task waits for its own slot; any other takes
   the free slot whose cache shares the longest prefix with its prompt, the first on a tie);
2. resume every task that is not waiting for a decode, each until it asks for one (or ends);
   the items it yields go to its caller's queue on the way (``Task`` is iterated on the
   caller's thread: the HTTP side never waits on this thread's time, nor this one on it);
3. decode: every drafting step of every slot in one draft-model batch; the target's batch
   (verification rows, prompt chunks, greedy runs) waits while any slot still drafts, so
   that every slot's rows go to the target together; a step where the target's batch holds
   only greedy runs decodes them inside the native library for several tokens at once
   (``backend.batch.Batcher.flush``).

With one slot the same loop runs the one task, whose context decodes in place (no batcher):
the N = 1 case of the same code. A task ends when its body does, or when its caller cancels it
(``Cancelled`` is raised inside it where it waits, so its ``finally`` blocks keep the caches
consistent). ``call`` runs one function as a task and returns its result: work between
generations (scoring, prefill, measuring costs) waits for a slot like any request.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from greenlet import getcurrent, greenlet

T = TypeVar("T")
_END = object()
# how long the loop waits for more work before it counts as idle (``when_idle``): a client that
# sends its next request as the last answer ends finds the loop still waiting for it (k auto's
# evidence, handed over at every answer of one client after another, cost the bundled pair at one
# thread 0.2 ms of a 29-ms answer on the step loop)
IDLE_AFTER = 0.05


class Cancelled(BaseException):
    """Raised inside a task whose caller has cancelled it (``Task.cancel``)."""


class Batcher(Protocol):
    """A context shared by several slots, as the loop drives it (``fly_cpp.backend.batch.Batcher``)."""

    def waiting(self) -> list[Any]: ...  # parked jobs, each with ``glet`` (who waits) and ``want`` (rows read)

    def flush(self, halt: np.ndarray | None = None) -> list[Any]: ...  # decode what fits one batch (halt: end runs early)

    def serve(self, parking: Any) -> None: ...  # its decodes inside this loop's tasks park (``LoopParking``)


class _TaskGreenlet(greenlet):
    """A task's greenlet (its parent is the step loop's)."""

    owner: Scheduler


def in_task() -> bool:
    """Whether the caller runs inside a task of a step loop (where a shared decode parks)."""
    return isinstance(getcurrent(), _TaskGreenlet)


def alone() -> bool:
    """Whether the caller's task is the only one its step loop runs now (nothing else will
    decode until it parks: it may drive a shared context directly)."""
    glet = getcurrent()
    return isinstance(glet, _TaskGreenlet) and glet.owner.active == 1


def current() -> greenlet:
    return getcurrent()


def park() -> None:
    """Hand the step thread back to the loop until it resumes this task (its decode done)."""
    glet = getcurrent()
    assert isinstance(glet, _TaskGreenlet) and glet.parent is not None
    glet.parent.switch()


class Task(Generic[T]):
    """One task: ``body(slot)`` on the step thread, its items read by iterating the task on
    the caller's thread (in order; the body's exception is raised there)."""

    def __init__(self, body: Callable[[int], Iterator[T]], slot: int | None, prompt: Sequence[int], kind: str) -> None:
        self.body, self.slot, self.prompt, self.kind = body, slot, prompt, kind
        self.at: int | None = None  # the slot it runs in, once admitted
        self.glet: greenlet | None = None
        self.cancelled = False
        # the items, then _END; a SimpleQueue, whose put and get take no Python-level lock (a
        # finalizer may put or cancel on any thread) and whose get waits in C
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self.done = threading.Event()

    # -- the caller's side -------------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        try:
            while True:
                item = self._items.get()
                if item is _END:
                    if self._error is not None:
                        raise self._error
                    return
                yield item
        finally:
            if not self.done.is_set():
                self.cancel()

    def cancel(self) -> None:
        """Stop the task (at its next wait for a decode, or before it starts) and wait until it
        has ended; from the step thread itself it is only marked. Nothing here or on the step
        thread's side holds a lock while it waits, so a finalizer that cancels wherever the
        garbage collector runs cannot hold the loop off."""
        self.cancelled = True
        owner = self._owner
        if owner is not None:
            owner._wake()
            if threading.current_thread() is not owner._thread:
                self.done.wait()

    # -- the step thread's side --------------------------------------------------------------

    _owner: Scheduler | None = None

    def _put(self, item: Any) -> None:
        self._items.put(item)

    def _end(self, error: BaseException | None) -> None:
        self._error = error
        self._put(_END)
        self.done.set()


class LoopParking:
    """How a shared batch's decodes park in this module's step loops (``backend.batch.Parking``)."""

    in_task = staticmethod(in_task)
    alone = staticmethod(alone)
    current = staticmethod(current)
    park = staticmethod(park)


class Scheduler:
    """The step loop over ``n`` slots (see the module's docstring). ``target`` / ``draft``: the
    batchers of the contexts the slots share (None with one slot, or no draft model);
    ``cached(slot)``: the tokens slot's cache holds (to place a task by its prompt)."""

    def __init__(self, n: int, target: Batcher | None, draft: Batcher | None,
                 cached: Callable[[int], Sequence[int]]) -> None:
        self.n = n
        self.target, self.draft, self.cached = target, draft, cached
        for shared in (target, draft):
            if shared is not None:
                shared.serve(LoopParking())  # their decodes inside this loop's tasks park until it flushes them
        self.busy: list[Task[Any] | None] = [None] * n
        self._inbox: queue.SimpleQueue[Task[Any] | None] = queue.SimpleQueue()  # tasks; None: a wake-up
        self._queued: dict[int, Task[Any]] = {}  # submitted, not admitted nor ended (single dict operations)
        self._waiting: list[Task[Any]] = []  # seen by the loop, waiting for a slot (in arrival order)
        self._closing = False
        self._idle: list[Callable[[], None]] = []  # called each time the loop runs out of work (``when_idle``)
        self._hub: greenlet | None = None
        self._news = np.zeros(1, dtype=np.int32)  # set when a task comes or is cancelled: greedy runs end early
        self._thread = threading.Thread(target=self._main, name="fly-cpp-step", daemon=True)
        self._thread.start()

    # -- any thread ----------------------------------------------------------------------------

    def submit(self, body: Callable[[int], Iterator[T]], slot: int | None = None, prompt: Sequence[int] = (),
               kind: str = "generation") -> Task[T]:
        """Queue ``body`` for a slot (``slot``: that one; None: the best free one for ``prompt``)."""
        if slot is not None and not 0 <= slot < self.n:
            raise ValueError(f"slot {slot} outside 0..{self.n - 1}")
        if self._closing:
            raise RuntimeError("the engine is closed")
        task: Task[T] = Task(body, slot, prompt, kind)
        task._owner = self
        self._queued[id(task)] = task
        self._news[0] = 1
        self._inbox.put(task)
        return task

    def call(self, fn: Callable[[int], T], slot: int | None = None) -> T:
        """``fn(slot)`` run as a task in a free slot (or ``slot``); its result. From inside a
        task (on the step thread) it runs at once, in that task's slot."""
        running = self.running_task()
        if running is not None:
            assert running.at is not None
            return fn(running.at)
        for item in self.submit(lambda at: iter((fn(at),)), slot, kind="call"):
            return item
        raise RuntimeError("the task ended without a result")

    def running_task(self) -> Task[Any] | None:
        """The task whose greenlet is running now (None outside the step thread's tasks)."""
        if threading.current_thread() is not self._thread:
            return None
        current = getcurrent()
        return next((t for t in self.busy if t is not None and t.glet is current), None)

    def when_idle(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the step thread whenever the loop has run out of work and none came for
        ``IDLE_AFTER``, before it waits for more: what can wait for no one, waits for nothing
        there."""
        self._idle.append(fn)

    def pause(self) -> None:
        """Inside a task: let the other tasks take their next step before this one goes on."""
        if self.running_task() is None:
            raise RuntimeError("pause() outside a task of this step loop")
        park()

    @property
    def waiting(self) -> int:
        """Generations submitted that have no slot yet."""
        return sum(t.kind == "generation" for t in list(self._queued.values()))

    @property
    def active(self) -> int:
        """Slots running a task now."""
        return sum(t is not None for t in self.busy)

    def close(self) -> None:
        """Take no more tasks, let the running and waiting ones end, stop the thread."""
        self._closing = True
        self._inbox.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _wake(self) -> None:
        self._news[0] = 1
        self._inbox.put(None)

    # -- the step thread -----------------------------------------------------------------------

    def _main(self) -> None:
        self._hub = getcurrent()
        while True:
            self._news[0] = 0  # before the inbox is read: news after this point ends the next runs early
            idle = not (self.active or self._waiting or self._closing)
            if not idle:
                self._take(block=False)
            elif not self._take(block=True, timeout=IDLE_AFTER):  # nothing came for a moment: idle
                try:
                    for fn in self._idle:
                        fn()
                except Exception as e:  # as the loop's own failure: it goes on
                    self._fail(e)
                self._take(block=True)
            if self._closing and not self.active and not self._waiting:
                self._take(block=False)  # submitted as it closed: refused
                for task in self._waiting:
                    self._end(task, RuntimeError("the engine is closed"))
                return
            try:
                self._admit()
                self._advance()
                self._decode()
            except Exception as e:  # the loop's own failure: every task raises it, the loop goes on
                self._fail(e)

    def _take(self, block: bool, timeout: float | None = None) -> bool:
        """Move what has come to the inbox into the waiting list (``block``: wait for something,
        at most ``timeout`` seconds where given); whether anything came (a wake-up too)."""
        came = False
        try:
            item = self._inbox.get(timeout=timeout) if block else self._inbox.get_nowait()
            while True:
                came = True
                if item is not None:
                    self._waiting.append(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass
        return came

    def _end(self, task: Task[Any], error: BaseException | None) -> None:
        self._queued.pop(id(task), None)
        task._end(error)

    def _fail(self, error: Exception) -> None:
        for task in list(self._waiting):
            self._waiting.remove(task)
            self._end(task, error)
        for task in list(self.busy):
            if task is not None and task.glet:
                task.glet.throw(error)
            elif task is not None and task.at is not None:  # admitted, never started
                self.busy[task.at] = None
                self._end(task, error)

    def _admit(self) -> None:
        """Waiting tasks into free slots, in arrival order (a cancelled one ends unstarted)."""
        for task in list(self._waiting):
            if task.cancelled:
                self._waiting.remove(task)
                self._end(task, None)
                continue
            free = [i for i in ([task.slot] if task.slot is not None else range(self.n)) if self.busy[i] is None]
            if not free:
                continue
            prompt = list(task.prompt)
            task.at = max(free, key=lambda i: (_common_prefix(self.cached(i), prompt), -i))
            self._waiting.remove(task)
            self._queued.pop(id(task), None)
            self.busy[task.at] = task
            task.glet = _TaskGreenlet(lambda t=task: self._run(t))
            task.glet.owner = self

    def _run(self, task: Task[Any]) -> None:
        """A task's greenlet: its body to the end (or until it is cancelled)."""
        assert task.at is not None
        error: BaseException | None = None
        items = None
        try:
            if not task.cancelled:
                items = task.body(task.at)
                for item in items:
                    task._put(item)
                    if task.cancelled:
                        break
        except Cancelled:
            pass
        except BaseException as e:  # the caller's to raise
            error = e
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                try:
                    close()
                except BaseException as e:
                    error = error or e
            self.busy[task.at] = None
            self._end(task, error)

    def _advance(self) -> None:
        """Every task not waiting for a decode, resumed until it waits for one or ends."""
        parked = {id(j.glet) for b in (self.target, self.draft) if b is not None for j in b.waiting()}
        for task in list(self.busy):
            if task is None or task.glet is None or id(task.glet) in parked:
                continue
            task.glet.switch()
        for task in list(self.busy):  # a cancelled task leaves where it waits
            if task is not None and task.cancelled and task.glet:
                task.glet.throw(Cancelled())

    def _decode(self) -> None:
        """The step's decodes: the drafting steps of every slot together; the target's batch
        once no slot drafts any more (a draft's prompt, without rows to read, holds nothing)."""
        drafting = False
        if self.draft is not None and self.draft.waiting():
            drafting = any(j.want > 0 for j in self.draft.waiting())
            self.draft.flush(self._news)
        if self.target is not None and self.target.waiting() and not drafting:
            self.target.flush(self._news)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i

"""The step loop (``fly_cpp.engine.scheduler``) on its own: tasks in slots, their items in order on the
caller's thread, pinned and prefix-placed tasks, cancellation, errors, and the decode order of a
step (every drafting step first, then one target batch for every slot), with batchers that only
record what they would decode."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from fly_cpp.engine import scheduler
from fly_cpp.engine.scheduler import Scheduler


@dataclass
class Job:
    name: str
    want: int = 1
    glet: Any = None
    done: bool = False


@dataclass
class Recorder:
    """A batcher that decodes nothing: it records each batch's jobs, in the order of the step."""

    role: str
    log: list[tuple[str, list[str]]]
    jobs: list[Job] = field(default_factory=list)

    def waiting(self) -> list[Job]:
        return self.jobs

    def flush(self, halt: Any = None) -> list[Job]:
        taken, self.jobs = self.jobs, []
        self.log.append((self.role, sorted(j.name for j in taken)))
        for j in taken:
            j.done = True
        return taken

    def serve(self, parking: Any) -> None:  # the loop that takes it (it parks by the module's functions)
        pass

    def decode(self, job: Job) -> None:  # what a sequence view does (``_Batcher.decode``)
        job.glet = scheduler.current()
        self.jobs.append(job)
        try:
            scheduler.park()
        finally:
            if job in self.jobs:  # cancelled while it waited
                self.jobs.remove(job)
        assert job.done


@pytest.fixture
def loop():
    log: list[tuple[str, list[str]]] = []
    target, draft = Recorder("target", log), Recorder("draft", log)
    cached = {0: [], 1: [], 2: []}
    steps = Scheduler(3, target, draft, cached=lambda i: cached[i])
    yield steps, target, draft, log, cached
    steps.close()


def test_items_reach_the_caller_in_order_and_a_call_returns_its_result(loop):
    steps, *_ = loop
    assert list(steps.submit(lambda at: iter(range(5)))) == [0, 1, 2, 3, 4]
    assert steps.call(lambda at: at * 10 + 7) == 7  # the first free slot
    assert steps.call(lambda at: steps.call(lambda inner: (at, inner)), slot=2) == (2, 2)  # inside a task: in its slot
    assert steps.active == 0 and steps.waiting == 0


def test_a_step_drafts_every_slot_before_one_target_batch(loop):
    """Slot 0 drafts two steps, slot 1 one, slot 2 none: the target's batch waits until no slot
    drafts, then holds every slot's rows."""
    steps, target, draft, log, _ = loop

    def body(name: str, drafts: int):
        def run(at: int):
            for i in range(drafts):
                draft.decode(Job(f"{name}.d{i}"))
            target.decode(Job(f"{name}.v"))
            yield name
        return run

    tasks = [steps.submit(body(n, d), slot=i) for i, (n, d) in enumerate([("a", 2), ("b", 1), ("c", 0)])]
    assert [list(t) for t in tasks] == [["a"], ["b"], ["c"]]
    assert log == [("draft", ["a.d0", "b.d0"]), ("draft", ["a.d1"]), ("target", ["a.v", "b.v", "c.v"])]


def test_a_draft_prompt_holds_no_target_batch(loop):
    steps, target, draft, log, _ = loop

    def run(at: int):
        (draft if at == 0 else target).decode(Job("prompt" if at == 0 else "rows", want=0 if at == 0 else 1))
        yield at

    tasks = [steps.submit(run, slot=i) for i in range(2)]
    assert [list(t) for t in tasks] == [[0], [1]]
    assert log == [("draft", ["prompt"]), ("target", ["rows"])]  # in the same step


def test_a_pinned_task_waits_for_its_slot_while_others_run(loop):
    steps, target, *_ = loop
    release = threading.Event()

    def hold(at: int):
        while not release.is_set():
            target.decode(Job("hold"))
        yield "held"

    first = steps.submit(hold, slot=1)
    items = iter(first)
    pinned = steps.submit(lambda at: iter([at]), slot=1)
    assert list(steps.submit(lambda at: iter([at]))) == [0]  # slot 0 is free meanwhile
    assert steps.waiting == 1 and steps.busy[1] is not None
    release.set()
    assert list(items) == ["held"] and list(pinned) == [1]


def test_a_task_takes_the_free_slot_that_shares_most_of_its_prompt(loop):
    steps, *_, cached = loop
    cached[2].extend([5, 6, 7])
    cached[1].extend([5, 9])
    assert list(steps.submit(lambda at: iter([at]), prompt=[5, 6, 7, 8])) == [2]
    assert list(steps.submit(lambda at: iter([at]), prompt=[1])) == [0]  # a tie: the first


def test_a_cancelled_task_ends_where_it_waits_and_its_finally_runs(loop):
    steps, target, *_ = loop
    ended = []

    def forever(at: int):
        try:
            yield "started"
            while True:
                target.decode(Job("x"))
        finally:
            ended.append(at)

    task = steps.submit(forever)
    items = iter(task)
    assert next(items) == "started"
    items.close()  # the reader goes away: the task is cancelled, and closing waits for its end
    assert ended == [0] and task.done.is_set() and steps.active == 0
    assert not target.jobs  # its parked job was never decoded, and is gone


def test_a_task_cancelled_before_it_starts_never_runs(loop):
    steps, target, *_ = loop
    release, ran = threading.Event(), []
    blockers = [steps.submit(lambda at: iter(_wait(release)), slot=i) for i in range(3)]
    late = steps.submit(lambda at: iter(ran.append(at) or [1]))
    late.cancel()
    release.set()
    assert [list(b) for b in blockers] == [[True]] * 3
    assert list(late) == [] and ran == []


def _wait(event: threading.Event):
    while not event.is_set():
        scheduler.park()
    yield True


def test_a_body_error_is_raised_on_the_callers_thread(loop):
    steps, *_ = loop

    def broken(at: int):
        yield 1
        raise ValueError("bad request")

    items = iter(steps.submit(broken))
    assert next(items) == 1
    with pytest.raises(ValueError, match="bad request"):
        next(items)
    assert list(steps.submit(lambda at: iter([2]))) == [2]  # the loop goes on


def test_a_failing_batch_fails_its_tasks_not_the_loop(loop):
    steps, target, *_ = loop

    def boom(halt: Any = None) -> list[Job]:
        raise RuntimeError("decode failed")

    target.flush = boom  # type: ignore[method-assign]
    items = iter(steps.submit(lambda at: iter([target.decode(Job("v"))])))
    with pytest.raises(RuntimeError, match="decode failed"):
        next(items)
    assert list(steps.submit(lambda at: iter([3]))) == [3]


def test_close_lets_running_tasks_end_and_refuses_new_ones():
    log: list[tuple[str, list[str]]] = []
    steps = Scheduler(1, Recorder("target", log), None, cached=lambda i: [])
    items = iter(steps.submit(lambda at: iter(range(3))))
    steps.close()
    assert list(items) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="closed"):
        steps.submit(lambda at: iter([]))

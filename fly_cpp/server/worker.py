"""The engine's thread.

llama.cpp calls block, and one pair serves one generation at a time (the engine holds a lock
while a generation runs), so every generation runs on a single worker thread, in arrival order;
waiting requests queue in front of it. The event loop never blocks on the engine: it reads what
the worker produces through an asyncio queue.

A consumer that stops early (the client went away, the server is shutting down) sets the job's
cancel flag; the worker sees it before the next item, closes the generation (both KV caches stay
consistent, the engine lock is released) and takes the next job. A job still waiting when its
client leaves closes at once without generating.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
_ITEM, _ERROR, _END = "item", "error", "end"


class ShuttingDown(Exception):
    """A job arrived after shutdown began (HTTP 503)."""


class Worker:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fly-cpp-engine")
        self._lock = threading.Lock()
        self._cancels: set[threading.Event] = set()
        self.waiting = 0  # jobs queued, not started
        self.running = 0  # 0 or 1
        self.closed = False

    async def stream(self, make: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
        """Run ``make()`` on the worker and yield its items here, as they come."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        cancel = threading.Event()

        def post(kind: str, value: Any = None) -> None:
            try:
                loop.call_soon_threadsafe(items.put_nowait, (kind, value))
            except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
                cancel.set()

        def job() -> None:
            with self._lock:
                self.waiting -= 1
                self.running += 1
            it = make()
            try:
                if not cancel.is_set():
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
                    self.running -= 1

        if self.closed:
            raise ShuttingDown("the server is shutting down")
        with self._lock:
            self.waiting += 1
            self._cancels.add(cancel)
        try:
            self._pool.submit(job)
        except RuntimeError:
            with self._lock:
                self.waiting -= 1
            raise ShuttingDown("the server is shutting down") from None
        try:
            while True:
                kind, value = await items.get()
                if kind == _ITEM:
                    yield value
                elif kind == _ERROR:
                    raise value
                else:
                    return
        finally:
            cancel.set()
            with self._lock:
                self._cancels.discard(cancel)

    def stop(self) -> None:
        """Take no more jobs and end every open generation early (shutdown begins): their
        streams end, so their connections close while the server drains."""
        self.closed = True
        with self._lock:
            for cancel in self._cancels:
                cancel.set()

    def close(self) -> None:
        """Stop, and wait for the thread to finish."""
        self.stop()
        self._pool.shutdown(wait=True)

"""``--sleep-idle-seconds N``: after N seconds without work the server frees its models, as
llama-server sleeps, and loads them again for the next request that needs them.

Work is any request but the read-only ones (``/health``, ``/props``, ``/models``,
``/v1/models``, ``/metrics``, the chat page): those answer while asleep without waking it
(``/props`` says ``is_sleeping``), from what was known when the models went. A request that
wakes the server waits for the load. The pair sleeps only while no request is in flight and no
generation runs or waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from fly_cpp.server.runs import Runs
from fly_cpp.server.served import Served

READ_ONLY = frozenset({"/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics"})


class Sleep:
    def __init__(self, served: Served, runs: Runs, idle: float, is_page: Callable[[str], bool]) -> None:
        self.served, self.runs, self.idle, self.is_page = served, runs, idle, is_page
        self.active = 0  # requests in flight that use the models
        self.last = time.monotonic()

    def wakes(self, path: str) -> bool:
        return path not in READ_ONLY and not self.is_page(path)

    async def watch(self) -> None:
        """Put the pair to sleep once it has been idle long enough (runs until cancelled)."""
        served, worker = self.served, self.runs.worker
        while True:
            await asyncio.sleep(min(self.idle / 4, 0.25))
            fly = served.fly
            busy = fly is not None and (fly.engine.generations_running or fly.engine.generations_waiting)
            idle = self.active == 0 and not busy and worker.waiting == 0 and served.loaded.is_set()
            if not idle:
                self.last = time.monotonic()
            elif not served.sleeping and fly is not None and time.monotonic() - self.last >= self.idle:
                served.doze()  # on the event loop: a request from now on waits for wake()
                await run_in_threadpool(served.sleep)


class Waking:
    """Pure ASGI middleware: a request that uses the models wakes a sleeping pair first, and
    counts as work while it runs."""

    def __init__(self, app: Any, sleep: Sleep) -> None:
        self.app, self.sleep = app, sleep

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        sleep = self.sleep
        if scope["type"] != "http" or not sleep.wakes(scope["path"]):
            await self.app(scope, receive, send)
            return
        sleep.active += 1
        try:
            if sleep.served.sleeping:
                await run_in_threadpool(sleep.served.wake)
            await self.app(scope, receive, send)
        finally:
            sleep.active -= 1
            sleep.last = time.monotonic()

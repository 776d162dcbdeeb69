"""Generations as seen from the event loop: started on the worker, counted in the metrics,
collected whole or streamed, and abandoned when the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from starlette.requests import Request

from fly_cpp.server import errors, sse
from fly_cpp.server.metrics import Metrics
from fly_cpp.server.worker import Job, Unavailable, Worker

T = TypeVar("T")


class Runs:
    def __init__(self, worker: Worker, metrics: Metrics) -> None:
        self.worker = worker
        self.metrics = metrics

    def start(self, make: Callable[[], Iterator[T]], interrupt: Callable[[], None] | None = None, *,
              pinned: bool = False) -> Job[T]:
        """Queue a generation (``make`` runs on the worker; ``interrupt`` ends it early and
        cleanly at shutdown; ``pinned``: it asked for one slot); its items arrive through the
        Job. A refusal (queue full, shutting down) raises ``Unavailable`` here, before any
        response is sent."""
        try:
            job = self.worker.submit(make, interrupt, pinned=pinned)
        except Unavailable:
            self.metrics.count("requests_refused")
            raise
        self.metrics.count("requests")
        return job

    async def collect(self, request: Request, items: Job[T]) -> list[T] | None:
        """Every item, or None when the client disconnected first (the generation is abandoned)."""

        async def everything() -> list[T]:
            return [item async for item in items]

        task = asyncio.ensure_future(everything())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if task.done():
            return task.result()
        task.cancel()
        items.close()
        self.metrics.count("requests_aborted")
        return None

    async def events(self, events: AsyncIterator[bytes], after_error: bytes = b"",
                     error_event: Callable[[dict[str, Any]], bytes] = sse.event) -> AsyncIterator[bytes]:
        """Guard an SSE stream: an error after the headers went out becomes a final error event
        (``error_event({"error": {...}})``, then ``after_error``); a stream the client left
        before its end counts as aborted."""
        ended = False
        try:
            async for event in events:
                yield event
            ended = True
        except Exception as e:  # the status line is gone already: say it in the stream
            ended = True
            self.metrics.count("errors")
            yield error_event(errors.of(e))
            if after_error:
                yield after_error
        finally:
            if not ended:
                self.metrics.count("requests_aborted")


async def _disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


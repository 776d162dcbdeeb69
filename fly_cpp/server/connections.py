"""Connections under hostile or heavy traffic: uvicorn's HTTP/1.1 protocol (h11) with a
header timeout and a connection cap, and the cap itself, kept under the open-file limit.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive`` (``--keep-alive``),
but only when nothing at all arrives: a connection that sends half a request line and then
waits, or a fresh one that sends nothing, would stay open for ever and hold a file descriptor.
Here every connection must complete a request's headers within ``--header-timeout`` seconds
of opening (or of its previous response), and a connection past the ``cap`` displaces the
longest idle one (idle: not busy with a request, for at least ``SETTLE`` seconds). When every connection is busy, the new one
stays until its request arrives, which uvicorn's own ``limit_concurrency`` (cap + 1, the
connection itself counted) answers with 503 and a close. Bodies have their own limits
(``fly_cpp.server.bodies``).
"""

from __future__ import annotations

import os
import resource
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from fly_cpp.basics.errors import FlyError

RESERVE = 64  # descriptors kept free for model files, logs, and the engine's own needs
SETTLE = 0.5  # seconds a new or just-answered connection gets before it counts as idle


def limits(max_connections: int) -> tuple[int, int]:
    """(connection cap, accept backlog) that fit the open-file limit: the soft limit is raised
    to the hard one first (as servers do), then connections and the connections accepted in one
    go (each a descriptor before it can be turned away) share what the process does not use."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 32
    room = soft - used - RESERVE
    backlog = max(min(128, room // 4), 1)
    cap = min(max_connections, room - backlog)
    if cap < 4:
        raise FlyError(f"the open-file limit (ulimit -n {soft}) leaves room for {max(cap, 0)} connections; "
                       "raise it")
    return cap, backlog


def protocol(cap: int, header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the header timeout and the connection cap."""

    class Guarded(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._timer: Any = None
            self._idle_since = 0.0

        @property
        def busy(self) -> bool:
            """A request's headers are in and its response is not finished."""
            return self.cycle is not None and not self.cycle.response_complete

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._idle()
            # connections being closed are still in the set until their close completes
            open_ = [c for c in self.connections if isinstance(c, Guarded) and not c.transport.is_closing()]
            if len(open_) > cap:
                # a connection that has just opened is about to send its request: not idle yet
                now = self.loop.time()
                idle = sorted((c for c in open_ if c is not self and not c.busy and now - c._idle_since >= SETTLE),
                              key=lambda c: c._idle_since)
                for c in idle[: len(open_) - cap]:  # back to the cap, longest idle first
                    c.drop()

        def handle_events(self) -> None:
            super().handle_events()
            if self.busy:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.busy and not self.transport.is_closing():
                self._idle()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def drop(self) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self.transport.close()

        def _idle(self) -> None:
            self._idle_since = self.loop.time()
            self._disarm()
            self._timer = self.loop.call_later(header_timeout, self._expire)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self) -> None:
            self._timer = None
            if not self.busy:
                self.drop()

    return Guarded

"""The pair an app serves: given loaded, or loaded in the background after the port is bound.

While the models load, every endpoint but the chat page answers 503 with llama-server's
"Loading model" body (``Loading``, a pure ASGI middleware); ``/health`` turns 200 once they
are in. A load that fails is kept in ``error`` and reported through ``on_failure`` (the
``serve`` command then stops with that error).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fly_cpp.api.fly import Fly
from fly_cpp.server import errors

LOADING = "Loading model"


class Served:
    def __init__(self, fly: Fly | Callable[[], Fly]) -> None:
        self.fly: Fly | None = fly if isinstance(fly, Fly) else None
        self._load = None if isinstance(fly, Fly) else fly
        self.error: BaseException | None = None
        self.loaded = threading.Event()
        if self.fly is not None:
            self.loaded.set()
        # asleep (--sleep-idle-seconds): the models are freed; what the read-only endpoints show
        # of them was taken by ``snapshots`` (name -> builder) when they went
        self.sleeping = False
        self.snapshots: dict[str, Callable[[Fly], Any]] = {}
        self.snapshot: dict[str, Any] = {}
        self._sleep_lock = threading.Lock()

    @property
    def ready(self) -> Fly:
        if self.fly is None:
            raise RuntimeError("the models are not loaded yet" if not self.sleeping else "the server is asleep")
        return self.fly

    @property
    def can_sleep(self) -> bool:
        """Only a pair the app loaded itself can be freed and loaded again."""
        return self._load is not None

    def doze(self) -> None:
        """Say the pair sleeps from now on (on the event loop, before ``sleep``): the read-only
        endpoints answer from a snapshot taken here, and the next request that needs the models
        waits for ``wake``."""
        if self.fly is not None:
            self.snapshot = {name: build(self.fly) for name, build in self.snapshots.items()}
            self.sleeping = True

    def sleep(self) -> None:
        """Free the models (after ``doze``, once the caller made sure nothing uses them)."""
        with self._sleep_lock:
            fly = self.fly
            if fly is None or not self.sleeping:
                return
            self.fly = None
            fly.close()

    def wake(self) -> None:
        """Load the models again (blocking; concurrent callers wait for one load)."""
        with self._sleep_lock:
            if self.fly is None and self._load is not None:
                self.fly = self._load()
            self.sleeping = False

    def start(self, on_ready: Callable[[Fly], None], on_failure: Callable[[BaseException], None]) -> None:
        """Load in a background thread (nothing to do when the pair came loaded)."""
        if self._load is None:
            return
        load = self._load

        def run() -> None:
            try:
                self.fly = load()
            except BaseException as e:  # reported, not raised: this thread has no caller
                self.error = e
                on_failure(e)
                return
            self.loaded.set()
            on_ready(self.fly)

        threading.Thread(target=run, name="fly-cpp-load", daemon=True).start()


class Loading:
    """Pure ASGI middleware: 503 "Loading model" on every path but ``open_paths`` until the
    pair is loaded."""

    def __init__(self, app: Any, served: Served, open_paths: Callable[[str], bool]) -> None:
        self.app = app
        self.served = served
        self.open_paths = open_paths

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.served.loaded.is_set() or self.open_paths(scope["path"]):
            await self.app(scope, receive, send)
            return
        message = LOADING if self.served.error is None else f"the models failed to load: {self.served.error}"
        await errors.response(503, message)(scope, receive, send)

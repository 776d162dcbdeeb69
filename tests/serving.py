"""A ``fly-cpp serve --port 0`` subprocess for tests that talk to a real server over loopback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

FLY = [sys.executable, "-m", "fly_cpp.cli.main"]
STARTUP = 120  # seconds before a server that never says where it listens is a failure


class Server:
    """``url`` is read from the startup line; ``wait_ready`` (the default) waits for the models
    to be loaded (the "serving ... on URL" line, then /health 200)."""

    def __init__(self, tmp: Path, *args: str, wait_ready: bool = True, preexec_fn: Callable[[], None] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.log = tmp / f"serve-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen([*FLY, "serve", "--port", "0", "--log-level", "warning", *args],
                                     stdout=subprocess.DEVNULL, stderr=self.log.open("w"), preexec_fn=preexec_fn,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        pattern = r"serving .* on (http://127\.0\.0\.1:\d+)" if wait_ready else r"listening on (http://127\.0\.0\.1:\d+)"
        deadline = time.monotonic() + STARTUP
        while not (m := re.search(pattern, self.stderr())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"server did not start: {self.stderr()}")
            time.sleep(0.05)
        self.url = m.group(1)
        if wait_ready:
            assert httpx.get(self.url + "/health", timeout=30).json() == {"status": "ok"}

    def stderr(self) -> str:
        return self.log.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


def named_events(text: str) -> list[dict]:
    """A stream of named server-sent events (``event: NAME`` then ``data: JSON``, as Anthropic's
    and OpenAI Responses' streams send them): the events, each checked to carry its own name."""
    out = []
    for block in text.strip().split("\n\n"):
        kind, data = block.split("\n")
        assert kind.startswith("event: ") and data.startswith("data: ")
        event = json.loads(data[len("data: "):])
        assert kind == f"event: {event['type']}"
        out.append(event)
    return out

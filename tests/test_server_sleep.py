"""--sleep-idle-seconds (in process, a real tiny pair loaded by the app): the pair is freed
when idle, read-only endpoints answer without waking it, work wakes it, and the text after a
wake is the text before."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from fly_cpp import Fly
from fly_cpp.config import ServerSettings
from fly_cpp.basics.errors import FlyError
from fly_cpp.server import create_app

BODY = {"prompt": "Once upon a time", "n_predict": 8, "mode": "target", "temperature": 0}  # greedy: the same text


def asleep(c: TestClient, want: bool = True) -> bool:
    deadline = time.monotonic() + 60
    while c.get("/props").json()["is_sleeping"] is not want:
        assert time.monotonic() < deadline, "the server did not change state"
        time.sleep(0.05)
    return want


def test_sleep_and_wake(stories, stories_draft):
    loads = []

    def load() -> Fly:
        loads.append(1)
        return Fly(stories, stories_draft, n_ctx=256)

    settings = ServerSettings(sleep_idle_seconds=0.2, metrics=True)
    with TestClient(create_app(load, settings=settings, close_fly=True)) as c:
        deadline = time.monotonic() + 60
        while c.get("/health").status_code != 200:  # the first load runs in the background
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before = c.post("/completion", json=BODY).json()["content"]
        assert asleep(c)
        for path in ("/health", "/props", "/v1/models", "/metrics"):  # read-only: answered asleep
            assert c.get(path).status_code == 200, path
        n = len(loads)
        assert c.get("/props").json()["is_sleeping"] is True and len(loads) == n
        assert c.get("/v1/models").json()["data"][0]["id"] == "stories260K.gguf"
        count = c.post("/v1/messages/count_tokens", json={"messages": [{"role": "user", "content": "Hi"}]})
        assert count.status_code == 200 and len(loads) == n + 1  # work wakes it
        assert asleep(c)
        assert c.post("/completion", json=BODY).json()["content"] == before and len(loads) == n + 2
        assert c.get("/props").json()["is_sleeping"] is False


def test_a_given_pair_never_sleeps(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=256) as fly:
        with TestClient(create_app(fly, settings=ServerSettings(sleep_idle_seconds=0.1))) as c:
            time.sleep(0.5)
            assert c.get("/props").json()["is_sleeping"] is False


def test_bad_values_are_refused():
    for bad in (0, -2):
        with pytest.raises(FlyError, match="sleep_idle_seconds"):
            ServerSettings(sleep_idle_seconds=bad)

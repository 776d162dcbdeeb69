"""The prompt's progress (``Progress``, llama-server's ``return_progress``) and llama-server's
timing split, on the bundled stories260K pair with 16-token batches: one report before any decode
and one per llama-server batch, the last when the prompt's last token is decoded, whichever way
the first token comes (the prompt's own last row, or the first round with a draft)."""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient

from fly_cpp import Fly
from fly_cpp.server import create_app
from fly_cpp.rounds.step import Progress, Step

PROMPT = "the quick brown fox jumps over the lazy dog " * 4


@pytest.fixture(scope="module")
def fly(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=256, n_batch=16, n_threads=1, chat_format="chatml",
             temperature=0) as llm:  # greedy: answers of a known length
        yield llm


@pytest.fixture(scope="module")
def client(fly):
    with TestClient(create_app(fly)) as c:
        yield c


def _reports(fly, mode: str, cache_prompt: bool = True) -> tuple[list[Progress], list[Step]]:
    gen = fly.generate(PROMPT, max_tokens=4, mode=mode, cache_prompt=cache_prompt)
    events = list(gen.events())
    reports = [e for e in events if isinstance(e, Progress)]
    assert events[: len(reports)] == reports  # all of them before the first token
    return reports, [e for e in events if isinstance(e, Step)]


@pytest.mark.parametrize("mode", ["target", "spd", "fly"])
def test_one_report_per_llama_server_batch(fly, mode):
    n = len(fly.engine.tokenize(PROMPT))
    reports, steps = _reports(fly, mode, cache_prompt=False)  # nothing cached
    assert len(steps) == 4
    assert [r.processed for r in reports] == [0, *range(16, n, 16), n]  # 1 + ceil(n / 16) reports
    assert all(r.total == n and r.cache == 0 for r in reports)
    assert reports[0].seconds == 0 and all(a.seconds <= b.seconds for a, b in zip(reports, reports[1:]))
    again, _ = _reports(fly, mode)  # the whole prompt cached but its last token, which is decoded again
    assert [(r.cache, r.processed) for r in again] == [(n - 1, n - 1), (n - 1, n)]


def test_iterating_a_generation_gives_steps_only(fly):
    assert all(isinstance(s, Step) for s in fly.generate(PROMPT, max_tokens=3))


def _stream(client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    return [json.loads(line) for line in lines]


def test_completion_streams_progress_with_timings(client, fly):
    n = len(fly.engine.tokenize(PROMPT))
    events = _stream(client, "/completion", {"prompt": PROMPT, "n_predict": 4, "return_progress": True,
                                             "timings_per_token": True, "cache_prompt": False})
    progress = [e for e in events if "prompt_progress" in e]
    assert len(progress) == 1 + math.ceil(n / 16) and events[: len(progress)] == progress
    assert progress[-1]["prompt_progress"]["processed"] == n and all(e["content"] == "" for e in progress)
    first = progress[0]["timings"]
    assert first["prompt_n"] == 0 and first["prompt_ms"] == 0.0 and first["predicted_n"] == 0
    assert progress[-1]["timings"]["prompt_n"] == n and progress[-1]["timings"]["prompt_ms"] > 0
    plain = _stream(client, "/completion", {"prompt": PROMPT, "n_predict": 4})
    assert not any("prompt_progress" in e for e in plain)


def test_chat_progress_chunks_carry_the_role(client):
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, "return_progress": True}
    chunks = _stream(client, "/v1/chat/completions", body)
    progress = [c for c in chunks if "prompt_progress" in c]
    assert len(progress) >= 2 and chunks[0] == progress[0]
    assert all(c["choices"][0]["delta"] == {"role": "assistant", "content": None} for c in progress)
    p = progress[-1]["prompt_progress"]
    assert p["processed"] == p["total"] and set(p) == {"total", "cache", "processed", "time_ms"}
    text = _stream(client, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "return_progress": True})
    assert text[0]["prompt_progress"]["processed"] == text[0]["prompt_progress"]["cache"]


def test_generation_rate_leaves_out_the_first_token(client):
    one = client.post("/completion", json={"prompt": "I believe", "n_predict": 1}).json()["timings"]
    assert one["predicted_n"] == 1 and one["predicted_per_second"] == 0.0 and one["predicted_per_token_ms"] == 0.0
    more = client.post("/completion", json={"prompt": "I believe", "n_predict": 12}).json()["timings"]
    assert more["predicted_n"] == 12
    assert math.isclose(more["predicted_per_second"], 1e3 / more["predicted_ms"] * 11)
    assert math.isclose(more["predicted_per_token_ms"], more["predicted_ms"] / 11)

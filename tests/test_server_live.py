"""``fly-cpp serve`` as a client sees it: a real server process on a loopback port, the bundled
tiny pair, the official ``openai`` client and raw HTTP. Only 127.0.0.1 is ever contacted."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from serving import FLY, Server

KEY = "test-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # -c 2048 --temp 0: greedy stories260K loops without an end-of-text token, so long streams are possible
    s = Server(tmp_path_factory.mktemp("serve"), "-t", "1", "-c", "2048", "--temp", "0", "--api-key", KEY, "--metrics")
    yield s
    assert s.stop() == 0, s.stderr()


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c


@pytest.fixture()
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def counters(http) -> dict[str, float]:
    lines = http.get("/metrics").text.splitlines()
    return {name: float(value) for name, value in (line.split() for line in lines if not line.startswith("#"))}


def sse_data(lines) -> list[str]:
    """The data of each SSE event, checking the framing: 'data: ...' then a blank line."""
    out, expect_blank = [], False
    for line in lines:
        if expect_blank:
            assert line == "", f"event not followed by a blank line: {line!r}"
            expect_blank = False
        elif line:
            assert line.startswith("data: "), line
            out.append(line[len("data: "):])
            expect_blank = True
    return out


def test_openai_client_completions(oai):
    out = oai.completions.create(model="stories", prompt="Once upon a time", max_tokens=16)
    assert out.choices[0].text and out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 16
    text, finish = "", None
    for chunk in oai.completions.create(model="stories", prompt="Once upon a time", max_tokens=16, stream=True):
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    assert text and finish == "length"


def test_openai_client_chat(oai):
    messages = [{"role": "system", "content": "Tell stories."}, {"role": "user", "content": "A story about a cat."}]
    out = oai.chat.completions.create(model="stories", messages=messages, max_tokens=20,
                                      extra_body={"mode": "spd", "k": 4})
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content
    assert out.model_extra["fly"]["mode"] == "spd" and out.usage.completion_tokens == 20
    pieces, usage = [], None
    for chunk in oai.chat.completions.create(model="stories", messages=messages, max_tokens=20, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(pieces) and usage.completion_tokens == 20


def test_openai_client_wrong_key(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_api_key_refused_and_accepted(server, http):
    assert httpx.get(server.url + "/health").status_code == 200  # open without a key
    r = httpx.get(server.url + "/props")
    assert r.status_code == 401 and r.json()["error"]["code"] == 401
    assert httpx.post(server.url + "/completion", json={"prompt": "a"}).status_code == 401
    assert http.get("/props").json()["serving"].startswith("4 generations at a time")  # -np auto, as llama-server


def test_completion_raw_and_sse_framing(http):
    out = http.post("/completion", json={"prompt": "Once upon a time", "n_predict": 16, "mode": "target"}).json()
    assert out["tokens_predicted"] == 16 and out["timings"]["draft_n"] == 0
    with http.stream("POST", "/completion", json={"prompt": "Once upon a time", "n_predict": 16, "mode": "target",
                                                  "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(d) for d in sse_data(r.iter_lines())]
    assert "".join(e["content"] for e in events) == out["content"]
    assert events[-1]["stop"] is True and events[-1]["timings"]["predicted_n"] == 16
    with http.stream("POST", "/v1/completions", json={"prompt": "Once", "max_tokens": 8, "stream": True}) as r:
        data = sse_data(r.iter_lines())
    assert data[-1] == "[DONE]" and json.loads(data[-2])["usage"]["completion_tokens"] == 8


def test_metrics_counters_move(http):
    before = counters(http)
    out = http.post("/completion", json={"prompt": "Once upon a time", "n_predict": 12}).json()
    http.post("/completion", json={"prompt": "a", "temperature": -1})
    after = counters(http)
    assert after["fly_cpp_requests_total"] == before["fly_cpp_requests_total"] + 1
    assert after["fly_cpp_tokens_predicted_total"] == before["fly_cpp_tokens_predicted_total"] + 12
    assert after["fly_cpp_rounds_total"] == before["fly_cpp_rounds_total"] + out["fly"]["n_rounds"]
    assert after["fly_cpp_accepted_total"] - before["fly_cpp_accepted_total"] == out["timings"]["draft_n_accepted"]
    assert after["fly_cpp_errors_total"] == before["fly_cpp_errors_total"] + 1


MALFORMED = [
    ("/completion", b"{oops"), ("/completion", b'"text"'), ("/completion", {"prompt": [1.5]}),
    ("/completion", {"prompt": "a", "cache_prompt": "no"}), ("/completion", {"prompt": "a", "temperature": -1}),
    ("/completion", {"prompt": "a", "n_predict": -5}), ("/completion", {"prompt": "a", "top_k": 1.5}),
    ("/completion", {"prompt": "a", "window": -1}), ("/completion", {"prompt": "word " * 3000}),
    ("/v1/completions", {"prompt": "a", "max_tokens": "many"}), ("/v1/chat/completions", {"messages": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}), ("/tokenize", {"text": "a"}),
]


def test_malformed_requests_while_a_good_one_runs(http):
    good: dict[str, object] = {}

    def long_request() -> None:
        good["response"] = http.post("/completion", json={"prompt": "Once upon a time", "n_predict": 300,
                                                          "mode": "target"})

    worker = threading.Thread(target=long_request)
    worker.start()
    for path, body in MALFORMED:
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = http.post(path, **kwargs, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, (path, body, r.text)
        error = r.json()["error"]
        kind = "exceed_context_size_error" if "longer than the context" in error["message"] else "invalid_request_error"
        assert error["code"] == r.status_code and error["type"] == kind and error["message"]
    worker.join()
    response = good["response"]
    assert response.status_code == 200 and response.json()["tokens_predicted"] == 300
    assert http.get("/health").status_code == 200


def test_eight_concurrent_streams_all_complete(server):
    async def one(client: httpx.AsyncClient, i: int) -> tuple[str, int]:
        body = {"prompt": f"Once upon a time {i}", "max_tokens": 24, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            data = sse_data([line async for line in r.aiter_lines()])
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        return "".join(c["choices"][0]["text"] for c in chunks), chunks[-1]["usage"]["completion_tokens"]

    async def main() -> list[tuple[str, int]]:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"},
                                     timeout=300) as client:
            return await asyncio.gather(*(one(client, i) for i in range(8)))

    results = asyncio.run(main())
    assert len(results) == 8 and all(text and n == 24 for text, n in results)


def test_client_disconnect_frees_the_server(http):
    before = counters(http)
    # 1500 tokens take seconds; the client leaves after a few events
    with http.stream("POST", "/completion", json={"prompt": "Once upon a time", "n_predict": 1500, "mode": "target",
                                                  "stream": True}) as r:
        lines = r.iter_lines()
        seen = [line for _, line in zip(range(6), lines)]
        assert any(line.startswith("data: ") for line in seen)
    # the next request is served (the abandoned generation released the engine)...
    out = http.post("/completion", json={"prompt": "The cat", "n_predict": 8}).json()
    assert out["tokens_predicted"] == 8
    after = counters(http)
    # ...and the abandoned one stopped early: far fewer than 1500 tokens were generated for it
    assert after["fly_cpp_requests_aborted_total"] == before["fly_cpp_requests_aborted_total"] + 1
    assert after["fly_cpp_tokens_predicted_total"] - before["fly_cpp_tokens_predicted_total"] < 1500


def test_client_leaving_a_plain_request_frees_the_server(http):
    before = counters(http)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        http.post("/completion", json={"prompt": "Once upon a time", "n_predict": 2000, "mode": "target"},
                  timeout=httpx.Timeout(60, read=0.5))
    out = http.post("/completion", json={"prompt": "The cat", "n_predict": 8}).json()
    assert out["tokens_predicted"] == 8
    after = counters(http)
    assert after["fly_cpp_requests_aborted_total"] == before["fly_cpp_requests_aborted_total"] + 1
    assert after["fly_cpp_tokens_predicted_total"] - before["fly_cpp_tokens_predicted_total"] < 2000


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fly-cpp: error: "), result.stderr
    return lines[0]


def test_llama_cpp_flags_alias_and_chat_format(tmp_path):
    """-a names the model in /v1/models and in every response; llama.cpp's spellings start it."""
    s = Server(tmp_path, "-a", "my-model", "--chat-format", "llama3", "-t", "1", "-c", "512", "--temp", "0",
               "--draft-max", "4", "-fa", "off")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["my-model"]
        out = client.chat.completions.create(model="whatever", messages=[{"role": "user", "content": "Hi"}],
                                             max_tokens=4)
        assert out.model == "my-model" and out.usage.completion_tokens == 4
        assert httpx.post(s.url + "/completion", json={"prompt": "a", "n_predict": 2}, timeout=60).json()["model"] == \
            "my-model"
    finally:
        assert s.stop() == 0, s.stderr()
    r = subprocess.run([*FLY, "serve", "--port", "0", "--chat-format", "llama9"], capture_output=True, text=True,
                       timeout=120)
    assert "llama9" in one_line_error(r)


def test_port_in_use_is_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([*FLY, "serve", "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert f"cannot listen on 127.0.0.1:{port}" in one_line_error(r)


def test_bad_model_path_is_one_line(tmp_path):
    r = subprocess.run([*FLY, "serve", "--port", "0", "-m", str(tmp_path / "missing.gguf")], capture_output=True,
                       text=True, timeout=120)
    assert "missing.gguf" in one_line_error(r)


def test_sigterm_during_a_stream_exits_cleanly(tmp_path):
    s = Server(tmp_path, "-t", "1", "-c", "2048")
    try:
        with httpx.stream("POST", s.url + "/completion", json={"prompt": "Once upon a time", "n_predict": 1800,
                                                              "mode": "target", "stream": True, "temperature": 0},
                          timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
            s.proc.send_signal(signal.SIGTERM)
            try:
                for _ in lines:
                    pass
            except httpx.HTTPError:
                pass  # the server may cut the stream when its grace period ends
        assert s.proc.wait(timeout=60) == 0, s.stderr()
        assert "Traceback" not in s.stderr()
    finally:
        s.stop()


def test_sigint_exits_cleanly(tmp_path):
    s = Server(tmp_path, "-t", "1")
    assert s.stop(signal.SIGINT) == 0, s.stderr()
    assert "Traceback" not in s.stderr()

"""``fly-cpp serve`` and the CLI under hostile input, overload and shutdown: each probe that
once broke them (idle and half-sent connections at the file limit, huge batches and thread
counts, shutdown with work in flight, huge prompts, empty keys, NaN penalties, invalid
Unicode, absurd contexts) is a test here. Real server processes on loopback, the bundled pair."""

from __future__ import annotations

import json
import resource
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from serving import FLY, Server

from fly_cpp.server.connections import SETTLE

PROMPT = "Once upon a time"


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fly-cpp: error: "), result.stderr
    return lines[0]


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*FLY, *args], input=stdin, capture_output=True, timeout=120)
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode(errors="replace"),
                                       out.stderr.decode(errors="replace"))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` (reads EOF or a reset) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


# 1. idle and half-sent connections, at the open-file limit

def test_half_sent_connections_at_the_file_limit(tmp_path):
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    s = Server(tmp_path, "-t", "1", "--header-timeout", "3", preexec_fn=low_limit)
    socks = []
    try:
        for _ in range(300):  # more than the process may open
            c = socket.create_connection(("127.0.0.1", int(s.url.rsplit(":", 1)[1])), timeout=30)
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            socks.append(c)
        time.sleep(2 * SETTLE)  # a connection that has just opened is about to send: not displaced yet
        r = httpx.get(s.url + "/health", timeout=30)
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        # the half-sent ones are dropped: the oldest to make room, the rest at the header timeout
        assert all(closed(c, 30) for c in socks)
        assert httpx.get(s.url + "/health", timeout=30).status_code == 200
        log = s.stderr()
        # at the limit, at most the one rate-limited warning line (every 10 s), never a flood or a traceback
        fd_lines = [line for line in log.splitlines() if "Too many open files" in line]
        assert all("cannot accept connections" in line for line in fd_lines) and len(fd_lines) <= 5
        assert "Traceback" not in log and len(log) < 10_000
    finally:
        for c in socks:
            c.close()
        assert s.stop() == 0, s.stderr()


def test_idle_connection_times_out_and_slow_body_gets_408(tmp_path):
    s = Server(tmp_path, "-t", "1", "--header-timeout", "1", "--body-timeout", "1")
    port = int(s.url.rsplit(":", 1)[1])
    try:
        idle = socket.create_connection(("127.0.0.1", port))
        assert closed(idle, 30)  # nothing sent at all
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\":")
        slow.settimeout(30)
        answer = b""
        while chunk := slow.recv(4096):  # until the server closes the connection
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer
        slow.close()
        assert httpx.get(s.url + "/health", timeout=30).status_code == 200
    finally:
        assert s.stop() == 0, s.stderr()


def test_connection_cap_and_queue_limit(tmp_path):
    s = Server(tmp_path, "-t", "1", "-c", "2048", "--max-connections", "4", "--max-queue", "1")
    try:
        statuses: list[int] = []

        def ask() -> None:
            r = httpx.post(s.url + "/completion", json={"prompt": PROMPT, "n_predict": 1500, "mode": "target"},
                           timeout=120)
            statuses.append(r.status_code)
            if r.status_code == 503 and r.headers["content-type"].startswith("application/json"):
                assert "--max-queue" in r.json()["error"]["message"]  # (else: past the connection cap)

        threads = [threading.Thread(target=ask) for _ in range(6)]  # one runs, one waits, the rest are refused
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 503 in statuses and 200 in statuses and set(statuses) <= {200, 503}
        # at the connection cap: idle connections make room for new ones, which are served
        idle = [socket.create_connection(("127.0.0.1", int(s.url.rsplit(":", 1)[1]))) for _ in range(6)]
        time.sleep(1.5)  # past connections.SETTLE: they count as idle now
        assert httpx.get(s.url + "/health", timeout=30).status_code == 200
        for c in idle:
            c.close()
    finally:
        assert s.stop() == 0, s.stderr()


# 2. and 9. batch and context sizes

def test_huge_batch_is_capped_by_the_context(tmp_path):
    r = run("generate", "-p", PROMPT, "-n", "8", "-t", "1", "-c", "512", "--n-batch", "1000000000",
            "--n-ubatch", "1000000000", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["n_tokens"] == 8
    s = Server(tmp_path, "-t", "1", "-c", "512", "--n-batch", "1000000000")
    try:
        out = httpx.post(s.url + "/completion", json={"prompt": PROMPT, "n_predict": 8}, timeout=60).json()
        assert out["tokens_predicted"] == 8 and rss_mb(s.proc.pid) < 1000
    finally:
        assert s.stop() == 0, s.stderr()


@pytest.mark.parametrize("n_ctx,message", [("1099511627776", "n_ctx must be in [0, "),
                                           ("1000000000", "of memory available; lower -c/--n-ctx")])
def test_absurd_context_is_refused_at_once(n_ctx, message):
    assert message in one_line_error(run("generate", "-p", PROMPT, "-c", n_ctx, "-t", "1"))
    assert message in one_line_error(run("serve", "--port", "0", "-c", n_ctx, "-t", "1"))


def test_context_beyond_memory_is_refused_before_allocating():
    from fly_cpp.config import ModelSettings
    from fly_cpp.engine import Engine
    from fly_cpp.errors import FlyError
    from fly_cpp.models.bundled import TARGET

    with Engine(ModelSettings(str(TARGET), n_ctx=2048, n_batch=2**31 - 1, n_threads=1)) as e:
        assert e.target.n_batch <= 2048  # capped, the allocated batch included
    with pytest.raises(FlyError, match="needs about .* for the KV caches"):
        Engine.preflight(ModelSettings(str(TARGET), n_ctx=2**31 - 1, n_threads=1))


# 3. thread counts

@pytest.mark.parametrize("threads", ["100000", "65536", "513"])
def test_absurd_thread_counts_are_refused(threads):
    assert "n_threads must be at most" in one_line_error(run("generate", "-p", PROMPT, "-t", threads))
    assert "n_threads must be at most" in one_line_error(run("serve", "--port", "0", "-t", threads))
    assert "draft model: n_threads must be at most" in one_line_error(run("generate", "-p", PROMPT, "--draft-n-threads",
                                                                   threads, "-t", "1"))


# 4. shutdown with work in flight

def test_shutdown_ends_every_request_cleanly(tmp_path):
    s = Server(tmp_path, "-t", "1", "-c", "2048", "--grace", "20", "--metrics")
    results: dict[str, object] = {}

    def call(name: str, path: str, body: dict, stream: bool) -> None:
        try:
            if stream:
                with httpx.stream("POST", s.url + path, json=body, timeout=60) as r:
                    results[name] = (r.status_code, [line[6:] for line in r.iter_lines() if line.startswith("data: ")])
            else:
                r = httpx.post(s.url + path, json=body, timeout=60)
                results[name] = (r.status_code, r.json())
        except httpx.HTTPError as e:
            results[name] = e

    long = {"prompt": PROMPT, "n_predict": 1800, "mode": "target"}
    calls = [("running_stream", "/completion", {**long, "stream": True}, True),
             ("queued_plain", "/completion", {"prompt": "The cat", "n_predict": 40}, False),
             ("queued_oai_stream", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                            "stream": True, "max_tokens": 20}, True),
             ("queued_oai_plain", "/v1/completions", {"prompt": "hi", "max_tokens": 20}, False)]
    threads = [threading.Thread(target=call, args=c) for c in calls]
    for t in threads:
        t.start()
        time.sleep(0.3)
    deadline = time.monotonic() + 30
    while httpx.get(s.url + "/metrics").text.count("fly_cpp_requests_deferred 3") == 0:
        assert time.monotonic() < deadline, "the requests did not queue"
        time.sleep(0.05)
    s.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert s.proc.wait(timeout=60) == 0, s.stderr()
    assert "Traceback" not in s.stderr()

    status, events = results["running_stream"]  # type: ignore[misc]
    last = json.loads(events[-1])
    assert status == 200 and last["stop"] is True and last["fly"]["interrupted"] is True
    assert last["stop_type"] == "limit" and 0 < last["tokens_predicted"] < 1800
    status, body = results["queued_plain"]  # type: ignore[misc]
    assert status == 503 and "shutting down" in body["error"]["message"]
    status, events = results["queued_oai_stream"]  # type: ignore[misc]
    assert status == 200 and json.loads(events[0])["error"]["code"] == 503 and events[-1] == "[DONE]"
    status, body = results["queued_oai_plain"]  # type: ignore[misc]
    assert status == 503


def test_shutdown_during_a_plain_request_says_it_was_cut(tmp_path):
    s = Server(tmp_path, "-t", "1", "-c", "2048", "--metrics")
    result: dict[str, httpx.Response] = {}

    def call() -> None:
        result["r"] = httpx.post(s.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1800, "mode": "target"},
                                 timeout=60)

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 30
    while "fly_cpp_requests_processing 1" not in httpx.get(s.url + "/metrics").text:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    s.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert s.proc.wait(timeout=60) == 0, s.stderr()
    out = result["r"].json()
    assert result["r"].status_code == 200 and out["choices"][0]["finish_reason"] == "length"
    assert out["fly"]["interrupted"] is True and out["usage"]["completion_tokens"] < 1800


def test_new_requests_during_load_get_503_loading(tmp_path):
    s = Server(tmp_path, "-t", "1", wait_ready=False)
    try:
        seen = set()
        deadline = time.monotonic() + 60
        while 200 not in seen:
            assert time.monotonic() < deadline
            r = httpx.get(s.url + "/health", timeout=30)
            seen.add(r.status_code)
            if r.status_code == 503:
                assert r.json()["error"]["message"] == "Loading model"
        assert seen <= {200, 503}
    finally:
        assert s.stop() == 0, s.stderr()


# 5. huge prompts and bodies

def test_huge_body_is_413_and_a_big_prompt_does_not_stall_others(tmp_path):
    s = Server(tmp_path, "-t", "1", "--max-body", "4000000")
    try:
        before = rss_mb(s.proc.pid)
        big = b'{"prompt": "' + b"x" * 10_000_000 + b'"}'
        r = httpx.post(s.url + "/completion", content=big, timeout=60)
        assert r.status_code == 413 and "--max-body" in r.json()["error"]["message"]
        assert rss_mb(s.proc.pid) < before + 50
        # 3 MB of text takes seconds to tokenize; meanwhile the health check is answered
        text = "Once upon a time there was a little cat. " * 70_000
        done = threading.Event()
        answer: dict[str, httpx.Response] = {}

        def tokenize() -> None:
            answer["r"] = httpx.post(s.url + "/tokenize", json={"content": text}, timeout=120)
            done.set()

        threading.Thread(target=tokenize).start()
        time.sleep(0.5)  # the body is sent and being tokenized
        health_during = 0
        while not done.is_set():
            if httpx.get(s.url + "/health", timeout=30).status_code == 200 and not done.is_set():
                health_during += 1
            time.sleep(0.05)
        assert answer["r"].status_code == 200 and len(answer["r"].json()["tokens"]) > 500_000
        assert health_during > 0
    finally:
        assert s.stop() == 0, s.stderr()


# 6. API keys

def test_empty_api_key_is_refused_at_start():
    assert "the API key is empty" in one_line_error(run("serve", "--port", "0", "--api-key", "", "-t", "1"))
    r = subprocess.run([*FLY, "serve", "--port", "0", "-t", "1"], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "FLY_CPP_API_KEY": "  "})
    assert "the API key is empty" in one_line_error(r)


def test_api_key_with_spaces_is_stripped(tmp_path):
    s = Server(tmp_path, "-t", "1", "--api-key", "  spaced-key  ")
    try:
        assert httpx.get(s.url + "/props", headers={"Authorization": "Bearer spaced-key"}).status_code == 200
        assert httpx.get(s.url + "/props").status_code == 401
    finally:
        assert s.stop() == 0, s.stderr()


# 7. and 8. NaN penalties, invalid Unicode (the server's 400s are in test_server_app.py)

@pytest.mark.parametrize("option", ["--presence-penalty", "--frequency-penalty", "--repeat-penalty"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_penalties_are_refused(option, value):
    assert "must be a finite number" in one_line_error(run("generate", "-p", PROMPT, option, value, "-t", "1"))


def test_invalid_utf8_on_stdin_is_one_line():
    r = run("generate", "-p", "-", "-n", "4", "-t", "1", stdin=b"Once \xff")
    assert "standard input is not UTF-8 text (byte 0xff at offset 5)" in one_line_error(r)
    r = run("generate", "-p", "a\udcffb", "-n", "4", "-t", "1")  # argv bytes that are not UTF-8
    assert "not valid Unicode" in one_line_error(r)


def test_invalid_utf8_in_a_piped_chat_skips_that_line():
    r = run("chat", "-n", "4", "-t", "1", stdin=b"Hello\nbad \xff line\nAgain\n")
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert "that message is not UTF-8 text (byte 0xff at character 4); not sent" in r.stderr
    assert r.stderr.count("tokens,") == 2  # the two good lines were answered

"""``fly-cpp serve`` and the CLI under hostile input, overload and shutdown: each probe that
once broke them (idle and half-sent connections at the file limit, huge batches and thread
counts, shutdown with work in flight, huge prompts, empty keys, NaN penalties, invalid
Unicode, absurd contexts) is a test here. Real server processes on loopback, the bundled pair."""

from __future__ import annotations

import json
import re
import resource
import signal
import socket
import subprocess
import threading
import time
from contextlib import ExitStack
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


# a generation that cannot end on its own before the test signals: no EOS, a limit past its
# slot's context (SLOT_CTX positions: minutes of decoding at this size, even unloaded)
SLOT_CTX = 16384
ENDLESS = {"prompt": PROMPT, "n_predict": SLOT_CTX, "ignore_eos": True, "mode": "target"}


def gauges(url: str) -> dict[str, int]:
    """The server's own count of requests generating now and of those waiting for a slot."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return {name: int(float(v)) for name, v in re.findall(r"^llamacpp:requests_(processing|deferred) (\S+)$", text, re.M)}


def await_gauges(url: str, **want: int) -> None:
    """Wait until the server says it is generating ``processing`` requests and holding
    ``deferred`` ones (its own state: no guessing with sleeps)."""
    deadline = time.monotonic() + 60
    while (now := gauges(url)) != want:
        assert time.monotonic() < deadline, f"the server never reached {want}: {now}"
        time.sleep(0.02)


def holder(url: str, stack: ExitStack, **body: object) -> httpx.Response:
    """An endless stream whose first token has come: it holds a slot until the test closes it
    (the client going away)."""
    client = stack.enter_context(httpx.Client(timeout=60))
    r = stack.enter_context(client.stream("POST", url + "/completion", json={**ENDLESS, "stream": True, **body}))
    lines = r.iter_lines()
    stack.callback(lines.close)  # kept alive: dropping the iterator would close the stream
    assert r.status_code == 200 and next(line for line in lines if line.startswith("data: "))
    return r


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


@pytest.mark.parametrize("slots", [1, 4])
def test_queue_limit_cancellation_and_connection_cap(tmp_path, slots):
    s = Server(tmp_path, "-t", "1", "-np", str(slots), "-c", str(SLOT_CTX * slots), "--max-connections",
               str(slots + 3), "--max-queue", "1", "--metrics")
    try:
        with ExitStack() as stack:
            held = [holder(s.url, stack) for _ in range(slots)]  # every slot busy
            await_gauges(s.url, processing=slots, deferred=0)
            answer: dict[str, httpx.Response] = {}
            queued = threading.Thread(target=lambda: answer.update(r=httpx.post(
                s.url + "/completion", json={"prompt": PROMPT, "n_predict": 8}, timeout=120)))
            queued.start()
            await_gauges(s.url, processing=slots, deferred=1)
            r = httpx.post(s.url + "/completion", json={"prompt": PROMPT, "n_predict": 8}, timeout=60)
            assert r.status_code == 503 and "--max-queue" in r.json()["error"]["message"]
            for h in held:  # the clients go away: their slots are freed, the queued request runs
                h.close()
        queued.join(120)
        assert answer["r"].status_code == 200 and answer["r"].json()["tokens_predicted"] == 8
        await_gauges(s.url, processing=0, deferred=0)
        metrics = httpx.get(s.url + "/metrics").text
        assert f"fly_cpp_requests_aborted_total {slots}\n" in metrics and "fly_cpp_requests_refused_total 1\n" in metrics
        # at the connection cap: idle connections make room for new ones, which are served
        idle = [socket.create_connection(("127.0.0.1", int(s.url.rsplit(":", 1)[1]))) for _ in range(slots + 5)]
        time.sleep(1.5)  # past connections.SETTLE: they count as idle now
        assert httpx.get(s.url + "/health", timeout=30).status_code == 200
        for c in idle:
            c.close()
    finally:
        assert s.stop() == 0, s.stderr()


@pytest.mark.parametrize("slots", [1, 4])
def test_waiting_requests_start_in_arrival_order(tmp_path, slots):
    s = Server(tmp_path, "-t", "1", "-np", str(slots), "-c", str(SLOT_CTX * slots), "--metrics")
    try:
        # each prompt extends the one before: the cache a request finds shows which ran before it
        prompts = ["The cat", "The cat sat", "The cat sat on the mat"]
        cached: dict[int, int] = {}
        with ExitStack() as stack:
            held = [holder(s.url, stack) for _ in range(slots)]
            threads = []
            for i, prompt in enumerate(prompts):
                body = {"prompt": prompt, "n_predict": 4, "mode": "target"}
                threads.append(threading.Thread(target=lambda i=i, body=body: cached.update({i: httpx.post(
                    s.url + "/completion", json=body, timeout=120).json()["timings"]["cache_n"]})))
                threads[-1].start()
                await_gauges(s.url, processing=slots, deferred=i + 1)
            held[0].close()  # one slot frees: the waiting ones run there one after another
            for t in threads:
                t.join(120)
        assert cached[0] < cached[1] < cached[2]
    finally:
        assert s.stop() == 0, s.stderr()


def test_a_request_for_a_busy_slot_waits_for_it(tmp_path):
    s = Server(tmp_path, "-t", "1", "-np", "2", "-c", str(SLOT_CTX * 2), "--metrics")
    try:
        short = {"prompt": "The cat", "n_predict": 16, "mode": "target", "id_slot": 0, "temperature": 0}  # greedy
        alone = httpx.post(s.url + "/completion", json=short, timeout=60).json()["content"]
        answer: dict[str, httpx.Response] = {}
        with ExitStack() as stack:
            held = holder(s.url, stack, id_slot=0)
            pinned = threading.Thread(target=lambda: answer.update(r=httpx.post(s.url + "/completion", json=short,
                                                                                timeout=120)))
            pinned.start()
            await_gauges(s.url, processing=1, deferred=1)  # slot 1 is free, yet it waits for slot 0
            slots = httpx.get(s.url + "/slots").json()
            assert [slot["is_processing"] for slot in slots] == [True, False]
            # meanwhile the free slot serves the others (the waiting request holds no place of theirs)
            for _ in range(3):
                other = httpx.post(s.url + "/completion", json={"prompt": "hi", "n_predict": 4}, timeout=60)
                assert other.status_code == 200 and other.json()["id_slot"] == 1
            await_gauges(s.url, processing=1, deferred=1)
            held.close()
            pinned.join(120)
        out = answer["r"].json()
        assert answer["r"].status_code == 200 and out["id_slot"] == 0 and out["content"] == alone
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
    from fly_cpp.engine.engine import Engine
    from fly_cpp.basics.errors import FlyError
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

@pytest.mark.parametrize("slots", [1, 4])
def test_shutdown_ends_every_request_cleanly(tmp_path, slots):
    s = Server(tmp_path, "-t", "1", "-np", str(slots), "-c", str(SLOT_CTX * slots), "--grace", "20", "--metrics")
    results: dict[str, object] = {}
    first = {f"running_stream_{i}": threading.Event() for i in range(slots)}  # its first token came

    def call(name: str, path: str, body: dict, stream: bool) -> None:
        try:
            if stream:
                with httpx.stream("POST", s.url + path, json=body, timeout=60) as r:
                    events = []
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
                            first.get(name, threading.Event()).set()
                    results[name] = (r.status_code, events)
            else:
                r = httpx.post(s.url + path, json=body, timeout=60)
                results[name] = (r.status_code, r.json())
        except httpx.HTTPError as e:
            results[name] = e

    running = [(f"running_stream_{i}", "/completion", {**ENDLESS, "stream": True}, True) for i in range(slots)]
    queued = [("queued_plain", "/completion", {"prompt": "The cat", "n_predict": 40}, False),
              ("queued_oai_stream", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                             "stream": True, "max_tokens": 20}, True),
              ("queued_oai_plain", "/v1/completions", {"prompt": "hi", "max_tokens": 20}, False)]
    threads = []
    for n, c in enumerate(running + queued, 1):  # each one in place before the next is sent
        threads.append(threading.Thread(target=call, args=c))
        threads[-1].start()
        await_gauges(s.url, processing=min(n, slots), deferred=max(n - slots, 0))
    assert all(e.wait(60) for e in first.values())
    s.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert s.proc.wait(timeout=60) == 0, s.stderr()
    assert "Traceback" not in s.stderr()

    for name, *_ in running:
        status, events = results[name]  # type: ignore[misc]
        last = json.loads(events[-1])
        assert status == 200 and last["stop"] is True and last["fly"]["interrupted"] is True
        assert last["stop_type"] == "limit" and 0 < last["tokens_predicted"] < SLOT_CTX
    status, body = results["queued_plain"]  # type: ignore[misc]
    assert status == 503 and "shutting down" in body["error"]["message"]
    status, events = results["queued_oai_stream"]  # type: ignore[misc]
    assert status == 200 and json.loads(events[0])["error"]["code"] == 503 and events[-1] == "[DONE]"
    status, body = results["queued_oai_plain"]  # type: ignore[misc]
    assert status == 503


@pytest.mark.parametrize("slots", [1, 4])
def test_shutdown_during_a_plain_request_says_it_was_cut(tmp_path, slots):
    s = Server(tmp_path, "-t", "1", "-np", str(slots), "-c", str(SLOT_CTX * slots), "--metrics")
    result: dict[str, httpx.Response] = {}

    def call() -> None:
        body = {"prompt": PROMPT, "max_tokens": SLOT_CTX, "ignore_eos": True, "mode": "target"}
        result["r"] = httpx.post(s.url + "/v1/completions", json=body, timeout=60)

    t = threading.Thread(target=call)
    t.start()
    await_gauges(s.url, processing=1, deferred=0)
    s.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert s.proc.wait(timeout=60) == 0, s.stderr()
    out = result["r"].json()
    assert result["r"].status_code == 200 and out["choices"][0]["finish_reason"] == "length"
    assert out["fly"]["interrupted"] is True and out["usage"]["completion_tokens"] < SLOT_CTX


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

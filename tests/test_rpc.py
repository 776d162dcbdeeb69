"""The target over llama.cpp RPC servers (``--rpc``), on loopback only: ``fly-cpp rpc-server``
processes on free 127.0.0.1 ports (and llama.cpp's own rpc-server when FLY_CPP_LLAMA_BIN names
a directory built by scripts/build-llama-cpp.sh). Greedy tokens must not change when layers
move to servers; a bad address and a server killed mid-generation are one-line errors.

A lost server leaves threads parked inside llama.cpp for the rest of the process (see
fly_cpp.backend.rpc), so every test that kills a server does it to a subprocess client."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fly_cpp.backend import rpc
from fly_cpp.backend.lib import library
from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.engine.engine import Engine
from fly_cpp.basics.errors import FlyError
from fly_cpp.models import bundled

FLY = [sys.executable, "-m", "fly_cpp.cli.main"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "FLY_CPP_THREADS": "1"}
LLAMA_BIN = os.environ.get("FLY_CPP_LLAMA_BIN")
PROMPTS = ("Once upon a time", "The little dog ran to the park and", "Lily and Ben")
GREEDY = SamplingSettings(temperature=0)

pytestmark = pytest.mark.skipif(not rpc.supported(library()),
                                reason="llama-cpp-python was built without RPC (CMAKE_ARGS=-DGGML_RPC=ON)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """An rpc-server subprocess on a free loopback port: ``fly-cpp rpc-server`` or, given
    ``binary``, llama.cpp's own."""

    def __init__(self, binary: Path | None = None) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        args = ["-H", "127.0.0.1", "-p", str(self.port), "-t", "1"]
        cmd = [str(binary), *args] if binary else [*FLY, "rpc-server", *args]
        self.log = tempfile.NamedTemporaryFile(prefix="rpc-server-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=ENV)
        deadline = time.monotonic() + 60
        while not rpc.reachable(self.endpoint, timeout=1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"rpc-server did not start: {self.output()}")
            time.sleep(0.1)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def llama_cpp_rpc_server() -> Path | None:
    """llama.cpp's rpc-server in FLY_CPP_LLAMA_BIN (its build target is ggml-rpc-server)."""
    found = [Path(LLAMA_BIN) / name for name in ("ggml-rpc-server", "rpc-server")] if LLAMA_BIN else []
    return next((path for path in found if path.is_file()), None)


@pytest.fixture(scope="module", params=["fly-cpp", "llama.cpp"])
def servers(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """Two rpc-servers (endpoints) for the module's tests, one client at a time."""
    binary = None
    if request.param == "llama.cpp":
        binary = llama_cpp_rpc_server()
        if binary is None:
            pytest.skip("set FLY_CPP_LLAMA_BIN to a directory with llama.cpp's ggml-rpc-server "
                        "(scripts/build-llama-cpp.sh)")
    started = [RpcServer(binary) for _ in range(2)]
    yield started[0].endpoint, started[1].endpoint
    dead = [f"rpc-server {s.endpoint} died: {s.output()}" for s in started if s.proc.poll() is not None]
    for s in started:
        s.stop()
    assert not dead, dead


def greedy_runs(target: ModelSettings, draft: ModelSettings | None = None, n: int = 48) -> dict[str, list[list[int]]]:
    """Greedy tokens per mode and prompt. The engine is closed afterwards: an rpc-server serves
    one client at a time, and the next test's engine is that client."""
    out: dict[str, list[list[int]]] = {}
    with Engine(target, draft or ModelSettings(path=str(bundled.DRAFT), n_ubatch=1)) as engine:
        for mode in ("target", "spd", "fly"):
            # a fixed k for FLy: its text then does not depend on the draft lengths k auto picks
            # from timings, which a remote target changes (spd and target are exact at any k)
            spec = SpecSettings(mode=mode, k=4) if mode == "fly" else SpecSettings(mode=mode)
            out[mode] = [engine.generate(p, spec=spec, sampling=GREEDY, max_tokens=n).run().tokens for p in PROMPTS]
    return out


def settings(**changes: object) -> ModelSettings:
    # n_ubatch=1: batched verification computes exactly what one-token decoding does, on any device
    return ModelSettings(path=str(bundled.TARGET), n_ctx=bundled.N_CTX, n_ubatch=1, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def local_tokens() -> dict[str, list[list[int]]]:
    return greedy_runs(settings())


# -- identity -------------------------------------------------------------------------------


def test_target_split_over_two_servers_generates_the_same_tokens(servers, local_tokens):
    remote = greedy_runs(settings(rpc=servers))
    assert remote == local_tokens
    assert all(len(tokens) == 48 for tokens in remote["fly"])


def test_uneven_tensor_split_and_a_local_share_generate_the_same_tokens(servers, local_tokens):
    assert greedy_runs(settings(rpc=servers, tensor_split=(3, 1))) == local_tokens
    # one local device (the CPU keeps the first layers) and one remote: 3 of 5 layers + output offloaded
    assert greedy_runs(settings(rpc=servers[:1], n_gpu_layers=3)) == local_tokens


def test_draft_on_the_servers_too(servers, local_tokens):
    draft = ModelSettings(path=str(bundled.DRAFT), n_ubatch=1, rpc=servers[1:])
    assert greedy_runs(settings(rpc=servers[:1]), draft) == local_tokens


def test_tensor_split_longer_than_the_devices(servers):
    with pytest.raises(FlyError, match="tensor_split has 3 entries, the rpc servers and GPUs offer 2 devices"):
        Engine(settings(rpc=servers, tensor_split=(1, 1, 1)))


def test_a_busy_server_is_waited_for_and_survives_it(servers):
    """An rpc-server serves one client at a time: the handshake says so and waits its turn
    (giving up would leave a greeting that llama.cpp's rpc-server answers into a closed
    connection, and dies of SIGPIPE; the fixture checks the servers are alive at the end)."""
    notes: list[str] = []
    done: list[int] = []
    with Engine(settings(rpc=servers[:1])):
        waiter = threading.Thread(target=lambda: done.append(rpc.handshake(servers[0], timeout=0.2, note=notes.append)))
        waiter.start()
        deadline = time.monotonic() + 30
        while not notes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not done and len(notes) == 1
        assert f"no answer yet from rpc-server {servers[0]}: it serves one client at a time" in notes[0]
    waiter.join(30)
    assert done == [1]


# -- settings -------------------------------------------------------------------------------


def test_rpc_setting_is_parsed_and_checked():
    assert settings(rpc="127.0.0.1:50052, host:1").rpc == ("127.0.0.1:50052", "host:1")
    assert settings(rpc=["a:1"]).offloaded_layers == -1
    assert settings(rpc=["a:1"], n_gpu_layers=2).offloaded_layers == 2
    assert settings().offloaded_layers == -1 and settings().placed(local_gpus=False).offloaded_layers == 0  # every layer, where there are GPUs
    for bad, words in [("127.0.0.1", "expected HOST:PORT"), ("a:0", "1..65535"), ("a:x", "1..65535"),
                       ("::1:5", "expected HOST:PORT"), ("[::1]:5", "IPv6"), ("a:1,a:1", "twice"),
                       ("a:1,,b:2", "expected HOST:PORT")]:
        with pytest.raises(FlyError, match=re.escape(words)):
            settings(rpc=bad)


def test_the_draft_stays_here_unless_given_servers():
    target = settings(rpc=("a:1", "b:2"), tensor_split=(3, 1), n_threads=2)
    draft = target.for_draft("draft.gguf")
    assert (draft.rpc, draft.tensor_split, draft.n_threads) == ((), (), 2)
    assert target.for_draft("draft.gguf", rpc=("a:1",)).rpc == ("a:1",)


# -- command line ---------------------------------------------------------------------------


def fly(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLY, *args], input="", capture_output=True, text=True, timeout=timeout, env=ENV)


def one_line_error(r: subprocess.CompletedProcess[str], code: int) -> str:
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fly-cpp: error: "), r.stderr
    return lines[0]


def test_bad_addresses_are_one_line_errors():
    port = free_port()  # nothing listens there
    line = one_line_error(fly("generate", "-p", "x", "--rpc", f"127.0.0.1:{port}"), 1)
    assert f"rpc-server 127.0.0.1:{port} is unreachable: connection refused" in line
    assert "expected HOST:PORT" in one_line_error(fly("generate", "-p", "x", "--rpc", "127.0.0.1"), 1)
    assert "cannot resolve" in one_line_error(fly("generate", "-p", "x", "--rpc", "no-such-host.invalid:5"), 1)
    assert "give --rpc too" in one_line_error(fly("generate", "-p", "x", "--rpc-draft"), 2)


def test_something_else_on_the_port_is_named():
    with socket.socket() as listener:  # accepts, reads the greeting, answers nonsense
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        endpoint = "127.0.0.1:%d" % listener.getsockname()[1]
        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(FlyError, match=f"{endpoint} did not answer the RPC handshake: not an rpc-server"):
            rpc.handshake(endpoint, timeout=5)


def test_rpc_server_command_refuses_a_public_address_and_a_busy_port():
    line = one_line_error(fly("rpc-server", "-H", "0.0.0.0", "-p", str(free_port())), 2)
    assert "not a loopback address" in line and "no authentication" in line and "--trusted-network" in line
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert "cannot listen on 127.0.0.1:%d" % port in one_line_error(fly("rpc-server", "-p", str(port)), 1)


def test_generate_over_rpc_from_the_command_line(servers):
    r = fly("generate", "-p", "Once upon a time", "-n", "24", "--temp", "0", "--json", "--rpc", ",".join(servers),
            "--rpc-draft")
    assert r.returncode == 0, r.stderr
    local = fly("generate", "-p", "Once upon a time", "-n", "24", "--temp", "0", "--json")
    assert json.loads(r.stdout)["tokens"] == json.loads(local.stdout)["tokens"]


# -- a server dies mid-generation -----------------------------------------------------------

LONG = ["-p", "Once upon a time", "-n", "2000", "-c", "2048", "--mode", "target"]  # stories260K never stops


def test_killed_server_mid_generation_ends_the_command_with_one_line():
    dying, other = RpcServer(), RpcServer()
    try:
        proc = subprocess.Popen([*FLY, "generate", *LONG, "--rpc", f"{other.endpoint},{dying.endpoint}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        assert proc.stdout is not None
        proc.stdout.read(60)  # the echoed prompt and a few generated tokens: it is generating
        dying.stop()
        _, err = proc.communicate(timeout=60)
    finally:
        dying.stop()
        other.stop()
    r = subprocess.CompletedProcess(proc.args, proc.returncode, "", err)
    line = one_line_error(r, 1)
    assert f"rpc-server {dying.endpoint} stopped answering" in line and other.endpoint not in line


def test_killed_server_mid_stream_ends_the_request_and_serve_keeps_answering(tmp_path):
    dying = RpcServer()
    port = free_port()
    log = tmp_path / "serve.log"
    serve = subprocess.Popen([*FLY, "serve", "--port", str(port), "--log-level", "warning", "-c", "2048",
                              "--rpc", dying.endpoint], stdout=subprocess.DEVNULL, stderr=log.open("w"), env=ENV)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert serve.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.post("/completion", json={"prompt": "Once", "n_predict": 8}).status_code == 200
            events = []
            body = {"prompt": "Once upon a time", "n_predict": 2000, "stream": True, "mode": "target"}
            with http.stream("POST", "/completion", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        if len(events) == 3:
                            dying.stop()
            error = events[-1]["error"]
            assert error["code"] == 503 and f"rpc-server {dying.endpoint} stopped answering" in error["message"]

            health = http.get("/health")
            assert health.status_code == 503 and "stopped answering" in health.json()["error"]["message"]
            assert http.get("/props").status_code == 200
            for path, payload in [("/completion", {"prompt": "Once", "n_predict": 8}),
                                  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                            "stream": True})]:
                later = http.post(path, json=payload)
                assert later.status_code == 503, later.text
                assert f"rpc-server {dying.endpoint} stopped answering" in later.json()["error"]["message"]
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        if serve.poll() is None:
            serve.kill()
        dying.stop()

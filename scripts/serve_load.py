#!/usr/bin/env python3
"""Load a ``fly-cpp serve`` server with concurrent streaming clients; print requests/s and tokens/s.

    python scripts/serve_load.py                        # starts a server on the bundled pair (-t 1)
    python scripts/serve_load.py --clients 8 --requests 64 --max-tokens 64 -- -m T.gguf -d D.gguf
    python scripts/serve_load.py --url http://127.0.0.1:8080 --api-key KEY
    python scripts/serve_load.py --clients 4 --parallel 4 --llama-server llama-bin/llama-server

Each client streams /v1/completions requests back to back (prompts vary per request), or with
``--dataset NAME`` (humaneval, spec_bench, ... as ``fly-cpp bench`` has them) /v1/chat/completions
requests of that dataset's first ``--prompts`` prompts, rendered by each server's chat template. The server
generates ``--parallel`` requests at once (its slots); the others wait in its queue, so time to
first token includes that wait. ``--llama-server BIN``: the same load, then, against llama.cpp's
own server (scripts/build-llama-cpp.sh builds it) on the same model files with the same number
of slots, speculating with the draft model when there is one. Arguments after ``--`` go to
``fly-cpp serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

PROMPTS = ["Once upon a time", "The little dog", "Lily went to the park", "Tom had a red ball", "One day, a bird"]


def _text(chunk: dict) -> str:
    """The text of a streamed completion or chat chunk."""
    if not chunk.get("choices"):
        return ""
    choice = chunk["choices"][0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


async def client(http: httpx.AsyncClient, cid: int, n: int, body: dict, prompts: list[str] | None,
                 out: list[dict]) -> None:
    for i in range(n):
        if prompts is None:
            path, payload = "/v1/completions", {**body, "prompt": PROMPTS[(cid + i) % len(PROMPTS)]}
        else:  # each client goes through the prompts from its own starting point
            text = prompts[(cid * n + i) % len(prompts)]
            path, payload = "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
        for attempt in (1, 2):  # a keep-alive connection the server closed just as it was reused: once more
            try:
                got = await _one(http, path, payload)
                break
            except httpx.RemoteProtocolError:
                if attempt == 2:
                    raise
        out.append(got)


async def _one(http: httpx.AsyncClient, path: str, payload: dict) -> dict:
    """One streamed request: its time, time to first text, text and tokens."""
    start = time.perf_counter()
    first = None
    usage = None
    pieces = 0  # text chunks: the token count where a server sends no usage
    whole = []
    async with http.stream("POST", path, json=payload) as r:
        if r.status_code != 200:
            await r.aread()
            sys.exit(f"{path}: HTTP {r.status_code}: {r.text[:500]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            text = _text(chunk)
            whole.append(text)
            pieces += bool(text)
            if first is None and text:
                first = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    return {"seconds": time.perf_counter() - start, "ttft": first or 0.0, "text": "".join(whole),
            "tokens": usage["completion_tokens"] if usage else pieces}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


async def load(url: str, key: str | None, clients: int, requests: int, body: dict,
               prompts: list[str] | None = None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    results: list[dict] = []
    per_client = [requests // clients + (c < requests % clients) for c in range(clients)]
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as http:
        await http.post("/completion", json={"prompt": "warm up", "n_predict": 8})
        start = time.perf_counter()
        await asyncio.gather(*(client(http, c, per_client[c], body, prompts, results) for c in range(clients)))
        wall = time.perf_counter() - start
        metrics = (await http.get("/metrics")).text
    tokens = sum(r["tokens"] for r in results)
    return {"clients": clients, "requests": len(results), "wall_seconds": wall, "requests_per_second": len(results) / wall,
            "tokens": tokens, "tokens_per_second": tokens / wall,
            "mean_latency_seconds": statistics.mean(r["seconds"] for r in results),
            "mean_ttft_seconds": statistics.mean(r["ttft"] for r in results),
            "p50_ttft_seconds": _percentile([r["ttft"] for r in results], 0.5),
            "p95_ttft_seconds": _percentile([r["ttft"] for r in results], 0.95),
            "mean_accepted": _mean_accepted(metrics), **_sharing(metrics),
            **({"valid_answers": _valid(results, body["response_format"])} if "response_format" in body else {})}


def _valid(results: list[dict], response_format: dict) -> int:
    """How many answers parse as JSON and validate against the request's schema."""
    import jsonschema

    schema, n = response_format["json_schema"]["schema"], 0
    for r in results:
        try:
            jsonschema.validate(json.loads(r["text"]), schema)
            n += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return n


def _metrics(text: str) -> dict[str, str]:
    return dict(line.rsplit(None, 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))


def _sharing(metrics: str) -> dict[str, float]:
    """How the slots shared decodes (both servers: busy slots per decode; fly-cpp: rows too)."""
    values = _metrics(metrics)
    names = ("llamacpp:n_busy_slots_per_decode", "fly_cpp_target_rows_per_decode", "fly_cpp_draft_rows_per_decode")
    return {name.split(":")[-1]: round(float(values[name]), 2) for name in names if name in values}


def _mean_accepted(metrics: str) -> float | None:
    values = _metrics(metrics)
    if "fly_cpp_tokens_predicted_total" not in values:
        return None  # not fly-cpp
    rounds = float(values.get("fly_cpp_rounds_total", 0))
    return float(values["fly_cpp_tokens_predicted_total"]) / rounds if rounds else None


def start_server(args: list[str], python: str = sys.executable) -> tuple[subprocess.Popen, str]:
    """``fly-cpp serve ARGS`` on a free port, run by ``python`` (another checkout's virtualenv,
    say); its process and address once the models are loaded."""
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("FLY_CPP_THREADS", "1")
    proc = subprocess.Popen([python, "-m", "fly_cpp.cli.main", "serve", "--port", "0", "--log-level",
                             "warning", "--metrics", *args], stdout=subprocess.DEVNULL, stderr=log, env=env)
    deadline = time.monotonic() + 600
    while not (m := re.search(r"serving .* on (http://\S+)", open(log.name).read())):  # loaded
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"server did not start:\n{open(log.name).read()}")
        time.sleep(0.1)
    return proc, m.group(1)


def start_llama_server(binary: str, target: str, draft: str | None, parallel: int,
                       threads: int = 1, extra: Sequence[str] = ()) -> tuple[subprocess.Popen, str]:
    """llama.cpp's llama-server on the same files, with fly-cpp's threads and ``parallel`` slots
    (``extra``: more of its options, e.g. its draft settings)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [binary, "-m", target, "--port", str(port), "-t", str(threads), "-np", str(parallel), "--metrics"]
    if draft:  # the vendored llama-server drafts only with --spec-type beside -md (without it: the target alone)
        args += ["-md", draft, "-td", str(threads)]
        if "--spec-type" not in extra:
            args += ["--spec-type", "draft-simple"]
    args += extra
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"llama-server did not start (exit {proc.wait()}):\n{open(log.name).read()[-4000:]}")
        time.sleep(0.2)


def main() -> None:
    argv = sys.argv[1:]
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="an already running server (default: start one)")
    p.add_argument("--api-key")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=32, help="requests in all, spread over the clients")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--mode", help="fly, spd or target (default: the server's)")
    p.add_argument("--parallel", "-np", type=int, default=1, help="slots of the servers started here (-np)")
    p.add_argument("--threads", "-t", type=int, default=1, help="threads of the servers started here")
    p.add_argument("--llama-server", metavar="BIN", help="also load llama.cpp's llama-server on the same files")
    p.add_argument("--peer-draft", choices=("on", "off"), default="on",
                   help="llama-server speculates with the same draft model (off: the target alone; its build of "
                        "these sources crashes at start with the bundled stories260K draft)")
    p.add_argument("--peer-args", default="", help="more options for llama-server, e.g. '--spec-draft-n-max 5'")
    p.add_argument("--extract", action="store_true",
                   help="chat requests of scripts/data/extraction.json's ten prompts, constrained by its JSON schema "
                        "(response_format json_schema)")
    p.add_argument("--dataset", help="chat requests of this dataset's prompts (humaneval, spec_bench, ...; "
                                     "several, comma-separated: taken in turn)")
    p.add_argument("--prompts", type=int, default=20, help="how many of the dataset's prompts (default 20)")
    args = p.parse_args(argv)
    body = {"max_tokens": args.max_tokens, "temperature": 0, **({"mode": args.mode} if args.mode else {})}
    prompts = None
    if args.extract:
        data = json.loads((Path(__file__).parent / "data" / "extraction.json").read_text())
        prompts = data["prompts"]
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": data["schema"]}}
    elif args.dataset:
        from fly_cpp.bench.datasets import mixed
        each = -(-args.prompts // len(args.dataset.split(",")))  # several: split evenly between them, taken in turn
        prompts = [q.text for q in mixed(args.dataset, each)][: args.prompts]
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(["-t", str(args.threads), "-np", str(args.parallel), *serve_args])
    try:
        result = {"fly-cpp": asyncio.run(load(url, args.api_key, args.clients, args.requests, body, prompts))}
        if args.llama_server:
            props = httpx.get(url + "/props", headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key
                              else {}).json()
            peer, peer_url = start_llama_server(args.llama_server, props["model_path"],
                                                props.get("draft_model_path") if args.peer_draft == "on" else None,
                                                args.parallel, args.threads, shlex.split(args.peer_args))
            try:
                peer_body = {key: value for key, value in body.items() if key != "mode"}
                result["llama-server"] = asyncio.run(load(peer_url, None, args.clients, args.requests, peer_body, prompts))
            finally:
                peer.terminate()
                peer.wait()
        print(json.dumps(result, indent=2))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()

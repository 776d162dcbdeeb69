#!/usr/bin/env python3
"""Soak a ``fly-cpp serve`` server: N clients for a given time, mixed endpoints, distinct prompts,
random disconnects and some malformed requests; every answer is checked against a sequential
run of the same request (so answers mixed up between requests would show), and the server's
memory is sampled over time.

    nice -n 5 python scripts/soak.py --clients 16 --minutes 10            # starts a server: bundled pair, -t 1
    nice -n 5 python scripts/soak.py --clients 8 --minutes 3 --parallel 4 # the same server with -np 4
    nice -n 5 python scripts/soak.py --clients 4 --minutes 5 --prompts 8 --max-tokens 32 \\
        -- -m target.gguf -d draft.gguf
    python scripts/soak.py --url http://127.0.0.1:8080 --pid 1234 --api-key KEY
    nice -n 5 python scripts/soak.py --clients 4 --minutes 10 --parallel 4 --long 0.5 --long-tokens 300 \
        -- -c 512 --kv-unified        # long answers overflow the slots' one shared cache

Greedy decoding makes every answer a function of its request; the reference answers are made
first, one request at a time (``--prompts`` prompts x the two prompt shapes x ``--modes``),
with the same bodies the clients then send (``cache_prompt: false`` in both phases when
``--cold`` is given; by default the caches are reused, as clients use them). Arguments after
``--`` go to ``fly-cpp serve``. The report (stdout, and ``--json FILE``) gives requests by kind,
errors by kind (the deliberate malformed ones apart), answers checked, mismatched and mixed,
and RSS over time. ``--parallel N`` starts the server with ``-np N`` slots (and ``--n-ubatch 1``,
unless given after ``--``: with larger micro-batches a row's last bits may depend on the other
slots' rows, and a near-tied greedy answer could then differ from its reference); the report then
adds the slots seen busy at once (``/metrics``: requests_processing, requests_deferred) and each
slot's counters (``/slots`` totals).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

SUBJECTS = ["a cat", "a dog", "a red ball", "a little bird", "the sea", "a big tree", "a lost key", "the moon",
            "a brave girl", "a tiny boat", "a fox", "a garden", "a rainy day", "a kind dragon", "a robot",
            "a snowman", "a birthday", "a train", "an old clock", "a bee"]
NAMES = ["Lily", "Tom", "Sam", "Mia", "Ben", "Zoe", "Max", "Anna"]
MALFORMED = [  # (path, raw body) the server must answer 4xx
    ("/completion", b"{not json"), ("/completion", b'{"prompt": 5}'), ("/completion", b'{"prompt": "a", "top_k": -3}'),
    ("/completion", b'{"prompt": "a", "presence_penalty": NaN}'), ("/completion", b'{"prompt": "a\\ud800"}'),
    ("/v1/chat/completions", b'{"messages": "hi"}'), ("/v1/chat/completions", b'{"messages": []}'),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": "many"}'), ("/completion", b"[1, 2, 3]"),
    ("/completion", b'{"prompt": [1, 999999999]}'), ("/tokenize", b'{"text": "a"}'),
]
KINDS = ["completion", "completion_stream", "oai_text_stream", "chat", "chat_stream"]


def prompts(n: int) -> list[str]:
    out = []
    for i in range(n):
        name, subject = NAMES[i % len(NAMES)], SUBJECTS[(i * 7) % len(SUBJECTS)]
        out.append(f"{name} found {subject} on day {i + 1}. {name} said")
    return out


@dataclass
class Tally:
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    completed: collections.Counter[str] = field(default_factory=collections.Counter)
    disconnects: collections.Counter[str] = field(default_factory=collections.Counter)
    malformed: collections.Counter[str] = field(default_factory=collections.Counter)  # by status
    errors: collections.Counter[str] = field(default_factory=collections.Counter)  # by kind
    examples: dict[str, str] = field(default_factory=dict)
    checked: int = 0
    mismatched: int = 0
    mismatched_by_mode: collections.Counter[str] = field(default_factory=collections.Counter)
    mixed: int = 0
    cut_short: int = 0  # answers a full shared cache ended early (a prefix of their reference)
    tokens: int = 0

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        self.examples.setdefault(kind, detail[:300])


def body(kind: str, prompt: str, mode: str, max_tokens: int, cold: bool, k: str) -> tuple[str, dict[str, Any]]:
    common: dict[str, Any] = {"mode": mode, "temperature": 0, "stream": kind.endswith("stream"),
                              "k": k if k == "auto" else int(k)}
    if cold:
        common["cache_prompt"] = False
    if kind.startswith("long"):  # runs on past its end of text: several at once overflow a shared cache
        return "/completion", {**common, "prompt": prompt, "n_predict": max_tokens, "ignore_eos": True}
    if kind.startswith("completion"):
        return "/completion", {**common, "prompt": prompt, "n_predict": max_tokens}
    if kind.startswith("oai_text"):
        return "/v1/completions", {**common, "prompt": prompt, "max_tokens": max_tokens}
    return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}


def shape(kind: str) -> str:
    """Requests whose answers must be equal share a shape: the same prompt as text, or as chat,
    or a long answer. Under long answers a full shared cache may cut any answer short: then it
    must be a prefix of its reference."""
    return "chat" if kind.startswith("chat") else "long" if kind.startswith("long") else "text"


async def ask(http: httpx.AsyncClient, kind: str, path: str, payload: dict[str, Any],
              leave_after: int | None) -> tuple[str, str | None]:
    """(outcome, answer text): outcome "ok", "left" (a deliberate disconnect), or an error kind."""
    if not payload["stream"]:
        r = await http.post(path, json=payload)
        if r.status_code != 200:
            return f"http_{r.status_code}", r.text
        out = r.json()
        return "ok", out["content"] if "content" in out else out["choices"][0]["message"]["content"]
    pieces: list[str] = []
    async with http.stream("POST", path, json=payload) as r:
        if r.status_code != 200:
            return f"http_{r.status_code}", (await r.aread()).decode(errors="replace")
        n = 0
        ended = False
        async for line in r.aiter_lines():
            if not line:
                continue
            if not line.startswith("data: "):
                return "bad_sse_line", line
            data = line[6:]
            if data == "[DONE]":
                ended = True
                break
            event = json.loads(data)
            if "error" in event:
                return f"sse_error_{event['error'].get('code')}", data
            if "content" in event:  # llama-server
                pieces.append(event["content"])
                ended = event.get("stop", False) or ended
            else:
                choice = event["choices"][0]
                pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            n += 1
            if leave_after is not None and n >= leave_after:
                return "left", None
        if not ended:
            return "stream_cut", "".join(pieces)
    return "ok", "".join(pieces)


def normalise(kind: str, text: str) -> str:
    return text.lstrip() if kind.startswith("chat") else text


async def references(http: httpx.AsyncClient, pool: list[str], modes: list[str], max_tokens: int,
                     cold: bool, k: str, long_tokens: int = 0) -> dict[tuple[str, int, str], str]:
    refs = {}
    for i, prompt in enumerate(pool):
        for mode in modes:
            for kind in ("completion", "chat"):
                path, payload = body(kind, prompt, mode, max_tokens, cold, k)
                outcome, text = await ask(http, kind, path, payload, None)
                if outcome != "ok" or text is None:
                    sys.exit(f"reference request failed: {outcome}: {text}")
                refs[(shape(kind), i, mode)] = normalise(kind, text)
            if long_tokens:
                path, payload = body("long", prompt, mode, long_tokens, cold, k)
                outcome, text = await ask(http, "long", path, payload, None)
                if outcome != "ok" or text is None:
                    sys.exit(f"reference request failed: {outcome}: {text}")
                refs[("long", i, mode)] = text
    return refs


async def client(http: httpx.AsyncClient, rng: random.Random, deadline: float, pool: list[str], modes: list[str],
                 refs: dict[tuple[str, int, str], str], args: argparse.Namespace, tally: Tally) -> None:
    while time.monotonic() < deadline:
        if rng.random() < args.malformed:
            path, raw = rng.choice(MALFORMED)
            tally.requests["malformed"] += 1
            try:
                r = await http.post(path, content=raw, headers={"Content-Type": "application/json"})
            except httpx.HTTPError as e:
                tally.error("transport_on_malformed", repr(e))
                continue
            if 400 <= r.status_code < 500 and "error" in r.json():
                tally.malformed[str(r.status_code)] += 1
            else:
                tally.error(f"malformed_answered_{r.status_code}", f"{path} {raw!r}: {r.text}")
            continue
        kind = "long" if args.long_tokens and rng.random() < args.long else rng.choice(KINDS)
        i, mode = rng.randrange(len(pool)), rng.choice(modes)
        path, payload = body(kind, pool[i], mode, args.long_tokens if kind == "long" else args.max_tokens,
                             args.cold, args.k)
        leave = rng.random() < args.disconnects
        tally.requests[kind] += 1
        try:
            if leave and not payload["stream"]:
                try:
                    await asyncio.wait_for(ask(http, kind, path, payload, None), rng.uniform(0.05, 1.0))
                    outcome, text = "ok_before_leaving", None
                except asyncio.TimeoutError:
                    outcome, text = "left", None
            else:
                outcome, text = await ask(http, kind, path, payload, rng.randint(1, 6) if leave else None)
        except httpx.HTTPError as e:
            tally.error(f"transport_{type(e).__name__}", repr(e))
            continue
        if outcome == "left":
            tally.disconnects[kind] += 1
        elif outcome == "ok_before_leaving":
            tally.completed[kind] += 1
        elif outcome != "ok" or text is None:
            tally.error(outcome, f"{path} {json.dumps(payload)[:120]}: {text}")
        else:
            tally.completed[kind] += 1
            tally.checked += 1
            got, want = normalise(kind, text), refs[(shape(kind), i, mode)]
            if args.long_tokens and got != want and want.startswith(got):
                tally.cut_short += 1  # the shared cache was full (any answer beside the long ones): ended there, as a full context ends
            elif got != want:
                tally.mismatched += 1
                tally.mismatched_by_mode[mode] += 1
                own = _common(got, want)
                others = [key for key, ref in refs.items() if key != (shape(kind), i, mode) and _common(got, ref) > own]
                if others:
                    tally.mixed += 1
                tally.examples.setdefault(f"mismatch_{mode}", f"{kind} {i} {mode}: got {got[:120]!r} want {want[:120]!r}"
                                          f"{' (closer to ' + str(others[:2]) + ')' if others else ''}")


def _common(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def sample_rss(pid: int | None, every: float, deadline: float, start: float, out: list[tuple[float, float]]) -> None:
    while time.monotonic() < deadline:
        value = rss_mb(pid)
        if value is not None:
            out.append((round(time.monotonic() - start, 1), round(value, 1)))
        await asyncio.sleep(every)


async def sample_load(http: httpx.AsyncClient, every: float, deadline: float, out: list[tuple[int, int]]) -> None:
    """(requests_processing, requests_deferred) as the server counts them, every ``every`` s."""
    while time.monotonic() < deadline:
        try:
            text = (await http.get("/metrics")).text
        except httpx.HTTPError:
            text = ""
        found = dict(re.findall(r"^llamacpp:requests_(processing|deferred) (\S+)$", text, re.M))
        if len(found) == 2:
            out.append((int(float(found["processing"])), int(float(found["deferred"]))))
        await asyncio.sleep(every)


def load_summary(samples: list[tuple[int, int]], slots: list[dict[str, Any]]) -> dict[str, Any]:
    busy = collections.Counter(p for p, _ in samples)
    return {"slots": len(slots), "samples": len(samples),
            "processing_max": max((p for p, _ in samples), default=None),
            "processing_histogram": {str(n): busy[n] for n in sorted(busy)},
            "deferred_max": max((d for _, d in samples), default=None),
            "per_slot_totals": [s.get("totals") for s in slots]}


async def soak(url: str, pid: int | None, args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    pool = prompts(args.prompts)
    modes = args.modes.split(",")
    limits = httpx.Limits(max_connections=args.clients * 2 + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=args.timeout, limits=limits) as http:
        t0 = time.monotonic()
        refs = await references(http, pool, modes, args.max_tokens, args.cold, args.k, args.long_tokens)
        ref_seconds = time.monotonic() - t0
        before = (await http.get("/metrics")).text
        tally = Tally()
        rss: list[tuple[float, float]] = []
        start = time.monotonic()
        deadline = start + args.minutes * 60
        rng = random.Random(args.seed)
        tasks = [client(http, random.Random(rng.random()), deadline, pool, modes, refs, args, tally)
                 for _ in range(args.clients)]
        load: list[tuple[int, int]] = []
        await asyncio.gather(sample_rss(pid, args.rss_every, deadline, start, rss),
                             sample_load(http, 0.5, deadline, load), *tasks)
        wall = time.monotonic() - start
        rss.append((round(time.monotonic() - start, 1), round(rss_mb(pid) or 0.0, 1)))
        # after the storm: the same references again, one at a time (nothing left behind)
        again = await references(http, pool, modes, args.max_tokens, args.cold, args.k, args.long_tokens)
        after = (await http.get("/metrics")).text
        health = (await http.get("/health")).status_code
        r = await http.get("/slots")
        slots = r.json() if r.status_code == 200 else []
    drift = sum(1 for k in refs if refs[k] != again[k])
    done = sum(tally.completed.values())
    return {
        "clients": args.clients, "minutes": args.minutes, "prompts": len(pool), "modes": modes,
        "max_tokens": args.max_tokens, "k": args.k, "cold": args.cold, "reference_seconds": round(ref_seconds, 1),
        "wall_seconds": round(wall, 1), "requests": sum(tally.requests.values()), "requests_by_kind": dict(tally.requests),
        "completed": done, "completed_by_kind": dict(tally.completed), "deliberate_disconnects": sum(tally.disconnects.values()),
        "deliberate_malformed_by_status": dict(tally.malformed), "errors_by_kind": dict(tally.errors),
        "answers_checked": tally.checked, "answers_mismatched": tally.mismatched,
        "answers_cut_short_by_a_full_cache": tally.cut_short,
        "answers_mismatched_by_mode": dict(tally.mismatched_by_mode), "answers_mixed": tally.mixed,
        "references_changed_after": drift, "health_after": health,
        "rss_mb": {"start": rss[0][1] if rss else None, "end": rss[-1][1] if rss else None,
                   "max": max((v for _, v in rss), default=None), "samples": rss},
        "server_counters": _deltas(before, after), "load": load_summary(load, slots), "examples": tally.examples,
    }


def _deltas(before: str, after: str) -> dict[str, float]:
    def parse(text: str) -> dict[str, float]:
        return {k: float(v) for k, v in (line.split() for line in text.splitlines() if line and not line.startswith("#"))}

    b, a = parse(before), parse(after)
    keep = ("fly_cpp_requests_total", "fly_cpp_requests_aborted_total", "fly_cpp_errors_total",
            "fly_cpp_tokens_predicted_total", "fly_cpp_loosely_accepted_total", "llamacpp:tokens_predicted_total",
            "llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:spec_decode_num_draft_tokens_total")
    return {k: a.get(k, 0) - b.get(k, 0) for k in keep}


def start_server(serve_args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fly_cpp.cli.main", "serve", "--port", "0", "--log-level", "warning",
                             "--metrics", *serve_args], stdout=subprocess.DEVNULL, stderr=log, env=env)
    deadline = time.monotonic() + 900
    while not (m := re.search(r"serving .* on (http://\S+)", open(log.name).read())):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"server did not start:\n{open(log.name).read()}")
        time.sleep(0.2)
    print(f"server log: {log.name}", file=sys.stderr)
    return proc, m.group(1)


def main() -> None:
    argv = sys.argv[1:]
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="an already running server (default: start one, -t 1)")
    p.add_argument("--pid", type=int, help="the running server's process id, for its RSS")
    p.add_argument("--api-key")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--prompts", type=int, default=24, help="distinct prompts (each also sent as chat)")
    p.add_argument("--modes", default="fly,spd,target")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--disconnects", type=float, default=0.1, help="share of requests the client abandons")
    p.add_argument("--malformed", type=float, default=0.05, help="share of requests that are malformed on purpose")
    p.add_argument("--cold", action="store_true", help="cache_prompt: false on every request")
    p.add_argument("--k", default="8", help="k on every request; 'auto' adapts to measured timings, so fly "
                                            "answers are then not a function of the request alone")
    p.add_argument("--long", type=float, default=0.0,
                   help="share of requests that run --long-tokens past their end of text (ignore_eos), so that "
                        "several at once overflow a shared cache: every answer must finish, one the full cache "
                        "cut short as a prefix of its reference")
    p.add_argument("--long-tokens", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--rss-every", type=float, default=15)
    p.add_argument("--parallel", "-np", type=int, default=1,
                   help="slots of the server this script starts (-np N, with --n-ubatch 1 unless given after --)")
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)
    if args.parallel < 1:
        p.error("--parallel must be >= 1")
    if args.url is not None and args.parallel != 1:
        p.error("--parallel sets the slots of a server this script starts; give -np to the one at --url")
    proc, url, pid = None, args.url, args.pid
    if url is None:
        slots = ["-np", str(args.parallel)] if args.parallel > 1 else []
        if slots and not any(a.startswith(("--n-ubatch", "-ub")) for a in serve_args):
            slots += ["--n-ubatch", "1"]
        proc, url = start_server(["-t", "1", *slots, *serve_args])
        pid = proc.pid
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below stops the server
    try:
        report = asyncio.run(soak(url, pid, args))
    finally:
        if proc is not None:
            proc.terminate()
            report_exit = proc.wait(timeout=120)
            print(f"server exit status: {report_exit}", file=sys.stderr)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

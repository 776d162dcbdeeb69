#!/usr/bin/env python3
"""Chat answers through ``/v1/chat/completions`` from several servers on the same pair, interleaved
per question: each server's tok/s per question, and fly-cpp's ratio to each other server per
question (geometric mean and median).

    python scripts/chat_bench.py -m T.gguf -md D.gguf -c 4096 -t 2 --questions 10 -n 128 --temp 0.8 \\
        --config "fly=fly" --config "ls=llama-server" \\
        --config "ls16=llama-server --draft-max 16 --draft-p-min 0.75" --config "alone=llama-server-alone"

Every server is started once on the same files and context and kept up (memory allowing); a
question goes to every server in turn (the order rotates per question), one request at a time,
each with the same body: the question as the user's message, ``max_tokens``, ``temperature`` and
a seed per question (``--temp 0``: greedy). ``fly`` is ``fly-cpp serve`` at its defaults (ARGS
after the kind are added), ``llama-server`` is llama.cpp's server drafting with ``-md``
(``--spec-type draft-simple``, without which the vendored server decodes with the target alone),
``llama-server-alone`` the target alone. Time is the whole request (prompt and answer), tokens
the answer's ``usage.completion_tokens``; the first ``--warmup`` questions are asked first and not
counted. Questions: the Spec-Bench prompts of scripts/data/warm40.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_load  # noqa: E402

ROOT = Path(__file__).resolve().parent


def questions(n: int) -> list[str]:
    rows = [json.loads(line) for line in (ROOT / "data" / "warm40.jsonl").read_text().splitlines() if line.strip()]
    return [r["prompt"] for r in rows if r["category"] == "spec_bench"][:n]


def ask(url: str, question: str, n: int, temp: float, seed: int) -> tuple[float, int]:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": n, "temperature": temp, "seed": seed}
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=900)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    return wall, int(r.json()["usage"]["completion_tokens"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", required=True)
    p.add_argument("-md", required=True)
    p.add_argument("-c", type=int, default=4096)
    p.add_argument("-t", type=int, default=2)
    p.add_argument("--questions", type=int, default=10)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--temp", type=float, default=0.8)
    p.add_argument("--config", action="append", required=True, metavar="LABEL=KIND [ARGS]")
    p.add_argument("--llama-server", default=str(Path.home() / "llama-bin" / "llama-server"))
    p.add_argument("--json", help="also write every answer's numbers here (tok/s, and seconds and tokens)")
    a = p.parse_args()
    servers: dict[str, tuple[object, str]] = {}
    try:
        for spec in a.config:
            label, _, rest = spec.partition("=")
            kind, *extra = shlex.split(rest)
            if kind == "fly":
                servers[label] = serve_load.start_server(["-m", a.m, "-md", a.md, "-c", str(a.c), "-t", str(a.t), *extra])
            else:
                draft = None if kind == "llama-server-alone" else a.md
                servers[label] = serve_load.start_llama_server(a.llama_server, a.m, draft, 1, a.t, ["-c", str(a.c), *extra])
            print(f"{label}: up at {servers[label][1]}", file=sys.stderr, flush=True)
        labels = list(servers)
        qs = questions(a.warmup + a.questions)
        for q in qs[: a.warmup]:
            for label in labels:
                ask(servers[label][1], q, a.n, a.temp, 0)
        rows: list[dict[str, float]] = []
        answers: list[dict[str, tuple[float, int]]] = []  # per question: each server's (seconds, tokens)
        for i, q in enumerate(qs[a.warmup:]):
            row: dict[str, float] = {}
            answers.append({})
            for j in range(len(labels)):
                label = labels[(i + j) % len(labels)]
                wall, tokens = ask(servers[label][1], q, a.n, a.temp, i + 1)
                row[label] = tokens / wall
                answers[-1][label] = (round(wall, 3), tokens)
            rows.append(row)
            print(f"question {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), file=sys.stderr, flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()  # type: ignore[attr-defined]
    first = labels[0]
    print(f"\n{len(rows)} questions x {a.n} tokens, T {a.temp}, -c {a.c}, -t {a.t}\n")
    print("| server | median tok/s | " + f"{first} / it, geometric mean | median | per question |")
    print("|---|---|---|---|---|")
    for label in labels:
        ratios = [r[first] / r[label] for r in rows]
        geo = math.exp(statistics.fmean(math.log(x) for x in ratios))
        print(f"| {label} | {statistics.median(r[label] for r in rows):.2f} | {geo:.3f} | "
              f"{statistics.median(ratios):.3f} | {min(ratios):.2f}-{max(ratios):.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"tok_s": rows, "answers": answers}))


if __name__ == "__main__":
    main()

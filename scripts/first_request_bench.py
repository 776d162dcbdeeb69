"""A server's first request as a newcomer meets it: from the server's start to the end of its
first answer, `fly-cpp serve` in a fresh cache folder beside `llama-server -md` on the same pair
and request, interleaved:

    python scripts/first_request_bench.py -m TARGET.gguf -d DRAFT.gguf --llama-cpp-bin ~/llama-bin \\
        -p "def quicksort(xs):" -n 128 -t 2 [--rounds 3]

Each run starts the server, waits for /health to answer 200, sends one `/completion` (greedy,
`n_predict` tokens) and stops the server; the wall time from the start to the answer is taken.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_answer(argv: list[str], port: int, prompt: str, n: int, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        while True:
            if proc.poll() is not None:
                sys.exit(f"first_request_bench: {Path(argv[0]).name} exited {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.05)
        body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=900) as r:
            json.loads(r.read())
        return time.perf_counter() - t0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-d", "--draft", required=True)
    ap.add_argument("-p", "--prompt", default="def quicksort(xs):")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--llama-cpp-bin", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"fly-cpp serve": [], "llama-server -md": []}
    ratios = []
    for r in range(args.rounds):
        got: dict[str, float] = {}
        for name in (list(times) if r % 2 == 0 else list(times)[::-1]):
            port = free_port()
            with tempfile.TemporaryDirectory(prefix="fly-first-") as empty:
                env = {**os.environ, "FLY_CPP_CACHE": empty, "XDG_CACHE_HOME": os.path.join(empty, "xdg")}
                env.pop("FLY_CPP_COSTS", None)
                env.pop("FLY_CPP_EVIDENCE", None)
                if name == "fly-cpp serve":
                    argv = [sys.executable, "-m", "fly_cpp.cli.main", "serve", "-m", args.model, "-md", args.draft,
                            "-c", str(args.ctx_size), "-t", str(args.threads), "--port", str(port)]
                else:
                    # --spec-type beside -md: without it the vendored llama-server decodes with the target alone
                    argv = [str(args.llama_cpp_bin / "llama-server"), "-m", args.model, "-md", args.draft,
                            "--spec-type", "draft-simple", "-c", str(args.ctx_size), "-t", str(args.threads),
                            "--port", str(port)]
                got[name] = first_answer(argv, port, args.prompt, args.n, env)
        for k, v in got.items():
            times[k].append(v)
        ratios.append(got["fly-cpp serve"] / got["llama-server -md"])
        print(", ".join(f"{k} {v:.2f} s" for k, v in got.items()), flush=True)
    print("\n| server | first answer, median wall (s) | min | max |\n|---|---|---|---|")
    for k, v in times.items():
        print(f"| {k} | {statistics.median(v):.2f} | {min(v):.2f} | {max(v):.2f} |")
    print(f"\nfly-cpp / llama-server (per round, median): {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()

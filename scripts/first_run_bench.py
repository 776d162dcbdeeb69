"""A pair's first run as a newcomer meets it, timed as whole processes beside the same command
run again and beside llama.cpp's `llama-speculative-simple` at its defaults:

    python scripts/first_run_bench.py -m TARGET.gguf -d DRAFT.gguf --llama-cpp-bin ~/llama-bin \\
        -p "def quicksort(xs):" -p "def fib(n):" -p "def is_prime(n):" -n 64 -t 2 [--rounds 2]

For each prompt, in a rotating order: `fly-cpp generate` (its defaults, greedy) in a fresh cache
folder (`FLY_CPP_CACHE` and `XDG_CACHE_HOME` pointed at a new directory: nothing learned on the
pair or the machine), the same command again in that folder (warm), and `llama-speculative-simple`
with `-md` and `--spec-type draft-simple` at its defaults. Wall seconds of each whole process,
their medians, and the ratios the first run takes to the warm one and to llama.cpp's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=900)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"first_run_bench: {Path(argv[0]).name} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-d", "--draft", required=True)
    ap.add_argument("-p", "--prompt", action="append", required=True)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--llama-cpp-bin", type=Path)
    ap.add_argument("--rounds", type=int, default=1, help="passes over the prompts")
    args = ap.parse_args()
    fly = [sys.executable, "-m", "fly_cpp.cli.main", "generate", "-m", args.model, "-d", args.draft,
           "-n", str(args.n), "-t", str(args.threads), "--temp", "0"]
    times: dict[str, list[float]] = {"first": [], "again": [], "llama.cpp": []}
    pairs: list[tuple[float, float, float | None]] = []
    for r in range(args.rounds):
        for i, prompt in enumerate(args.prompt):
            with tempfile.TemporaryDirectory(prefix="fly-first-") as empty:
                env = {**os.environ, "FLY_CPP_CACHE": empty, "XDG_CACHE_HOME": os.path.join(empty, "xdg")}
                env.pop("FLY_CPP_COSTS", None)
                env.pop("FLY_CPP_EVIDENCE", None)
                order = ["first", "again", "llama.cpp"]
                shift = (i + r) % 3
                order = order[shift:] + order[:shift]
                while order.index("again") < order.index("first"):  # "again" follows its first run
                    order.remove("again")
                    order.append("again")
                got: dict[str, float] = {}
                for what in order:
                    if what == "llama.cpp":
                        if args.llama_cpp_bin is None:
                            continue
                        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
                            f.write(prompt + "\n")
                        argv = [str(args.llama_cpp_bin / "llama-speculative-simple"), "-m", args.model, "-md",
                                args.draft, "--spec-type", "draft-simple", "-f", f.name, "-n", str(args.n),
                                "-t", str(args.threads), "--temp", "0", "--seed", "0"]
                        got[what] = timed(argv, dict(os.environ))
                        os.unlink(f.name)
                    else:
                        got[what] = timed([*fly, "-p", prompt], env)
                for k, v in got.items():
                    times[k].append(v)
                pairs.append((got["first"], got["again"], got.get("llama.cpp")))
                line = ", ".join(f"{k} {v:.2f} s" for k, v in got.items())
                print(f"{prompt!r}: {line}", flush=True)
    print("\n| run | median wall (s) | min | max |\n|---|---|---|---|")
    for k, v in times.items():
        if v:
            print(f"| {k} | {statistics.median(v):.2f} | {min(v):.2f} | {max(v):.2f} |")
    first_again = statistics.median(a / b for a, b, _ in pairs)
    print(f"\nfirst / again (per prompt, median): {first_again:.3f}")
    if times["llama.cpp"]:
        first_peer = statistics.median(a / c for a, _, c in pairs if c)
        again_peer = statistics.median(b / c for _, b, c in pairs if c)
        print(f"first / llama-speculative-simple: {first_peer:.3f}; again / llama-speculative-simple: {again_peer:.3f}")


if __name__ == "__main__":
    main()

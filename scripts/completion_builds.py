"""llama-completion builds side by side: the same decoding, linked or compiled differently.

fly-cpp runs llama.cpp through llama-cpp-python's shared libraries; `scripts/build-llama-cpp.sh`
links llama.cpp's binaries statically. Which of a gap to llama-completion is fly-cpp's, and which
is the build's? This runs each given llama-completion on the same prompts, greedy, a fixed number
of tokens (`--ignore-eos`), the builds rotated from prompt to prompt, and prints each build's
tokens/s (read from its perf counters as `fly-cpp bench` reads them) against the first one's, per
prompt (geometric mean, 95% interval).

    python scripts/completion_builds.py MODEL.gguf BIN [BIN ...] [-t 2] [--prompts 20] [--repeats 3]

A BIN is a llama-completion executable (e.g. one built with -DBUILD_SHARED_LIBS=ON beside the
static one of scripts/build-llama-cpp.sh).
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile

from fly_cpp.bench.peer import parse_completion
from fly_cpp.basics.errors import FlyError

NAMES = ["Tom", "Sue", "Lily", "Ben", "Mia", "Max", "Anna", "Sam", "Tim", "Lucy"]
THINGS = ["a big dog", "a red ball", "a little bird", "a shiny car", "a happy cat"]


def rate(binary: str, model: str, prompt_file: str, n: int, threads: int) -> float:
    argv = [binary, "-m", model, "-f", prompt_file, "-n", str(n), "-c", "4096", "-t", str(threads), "--temp", "0",
            "--seed", "0", "-ngl", "0", "-no-cnv", "--perf", "--ignore-eos"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise SystemExit(f"error: cannot run {binary}: {e.strerror or e}") from None
    if done.returncode == 0:
        try:
            return parse_completion(done.stdout + "\n" + done.stderr).tokens_per_second
        except FlyError:
            pass  # no perf counters: said below
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise SystemExit(f"error: {binary} failed (exit {done.returncode}): {tail[:200]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("bins", nargs="+", help="llama-completion executables; the first is the reference")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if len(args.bins) < 2:
        ap.error("give at least two builds")
    prompts = [f"Once upon a time, {NAMES[i % 10]} went to the park. {NAMES[(i + 3) % 10]} saw {THINGS[i % 5]}."
               for i in range(args.prompts)]
    rates: list[list[float]] = [[] for _ in args.bins]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        for rep in range(args.repeats):
            for i, prompt in enumerate(prompts):
                f.seek(0)
                f.truncate()
                f.write(prompt + "\n")
                f.flush()
                shift = (i + rep) % len(args.bins)
                for b in list(range(len(args.bins)))[shift:] + list(range(len(args.bins)))[:shift]:
                    rates[b].append(rate(args.bins[b], args.model, f.name, args.n, args.threads))
    print(f"{args.bins[0]}: {statistics.median(rates[0]):.1f} tok/s (median), the reference")
    for b in range(1, len(args.bins)):
        logs = [math.log(x / r) for x, r in zip(rates[b], rates[0])]
        mean, se = statistics.mean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
        print(f"{args.bins[b]}: {statistics.median(rates[b]):.1f} tok/s; per prompt {math.exp(mean):.3f}x the reference "
              f"(95% {math.exp(mean - 1.96 * se):.3f}-{math.exp(mean + 1.96 * se):.3f}, {len(logs)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

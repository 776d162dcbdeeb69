"""A fresh process's first answers beside a warm process's: the same prompts answered one after
another in one `Fly` each, the first in a new cache folder (nothing learned on the pair or the
machine), the second in the folder the first left (its curves and evidence), repeated:

    python scripts/first_answers_bench.py -m TARGET.gguf -d DRAFT.gguf --dataset scripts/data/warm40.jsonl \\
        --limit 10 -n 64 -t 2 [--repeats 2]

Prints each process's summed answer seconds (decoding, the prompts' prefill included) and the
ratio of the fresh process's sum to the warm one's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time
from fly_cpp import Fly
args = json.loads(sys.argv[1])
with Fly(args["m"], args["d"], n_ctx=4096, n_threads=args["t"], temperature=0) as llm:
    total = 0.0
    for p in args["prompts"]:
        t0 = time.perf_counter()
        llm.create_completion(p, max_tokens=args["n"])
        total += time.perf_counter() - t0
print(total)
"""


def answers(spec: dict, cache: str) -> float:
    env = {**os.environ, "FLY_CPP_CACHE": cache, "XDG_CACHE_HOME": os.path.join(cache, "xdg")}
    env.pop("FLY_CPP_COSTS", None)
    env.pop("FLY_CPP_EVIDENCE", None)
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env,
                          timeout=1800)
    if done.returncode != 0:
        sys.exit(f"first_answers_bench: {done.stderr.strip().splitlines()[-1:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-d", "--draft", required=True)
    ap.add_argument("--dataset", default="scripts/data/warm40.jsonl")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with open(args.dataset, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    prompts = [r.get("prompt") or r.get("text") or r["turns"][0] for r in rows][: args.limit]
    spec = {"m": args.model, "d": args.draft, "t": args.threads, "n": args.n, "prompts": prompts}
    ratios = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="fly-first-") as cache:
            fresh = answers(spec, cache)
            warm = answers(spec, cache)
        ratios.append(fresh / warm)
        print(f"repeat {i + 1}: fresh process {fresh:.2f} s, warm process {warm:.2f} s, ratio {fresh / warm:.3f}",
              flush=True)
    print(f"fresh / warm, summed over {len(prompts)} answers (median of repeats): {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()

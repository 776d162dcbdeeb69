#!/usr/bin/env python3
"""What a target decode costs by verification-batch width policy (``fly_cpp.rounds.shape``): the rows
of k auto's rounds as they come (ragged) against padded to a steady width. Meant for a GPU,
where a decode of a new shape costs more than a repeat; on a CPU every padded row costs its share.

    python scripts/batch_shapes.py TARGET.gguf [ROUNDS] [-ngl N]

Rounds draw their draft length from k auto's histogram measured on an H100 (costly pair),
independently (the worst case for shape changes) and in runs (a length tends to repeat). Each
round decodes its rows (padded per policy), keeps them as if all were accepted, and the cache
starts again from the prompt when it grows deep. Policies take turns, four times, and the
first 20 rounds of every turn are not counted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.rounds.shape import Steady, padded

HISTOGRAM = {0: 23, 1: 213, 2: 99, 3: 73, 4: 42, 5: 57, 6: 104, 7: 132, 8: 11}  # draft length: rounds
POLICIES = ("ragged", "steady4", "steady16", "steady64", "pow2", "fixed6", "fixed9")


def sequences(n: int) -> dict[str, list[int]]:
    rng = random.Random(0)
    lengths, weights = list(HISTOGRAM), list(HISTOGRAM.values())
    runs, current = [], rng.choices(lengths, weights)[0]
    for _ in range(n):
        if rng.random() > 0.6:
            current = rng.choices(lengths, weights)[0]
        runs.append(current)
    return {"independent": rng.choices(lengths, weights, k=n), "runs": runs}


def widths(policy: str, drafts: list[int]) -> list[int]:
    rows = [n + 1 for n in drafts]
    if policy.startswith("steady"):
        steady = Steady(int(policy[len("steady"):]))
        return [steady.width(r, 1 << 20) for r in rows]
    if policy == "pow2":
        return [1 << (r - 1).bit_length() for r in rows]
    if policy.startswith("fixed"):
        return [max(int(policy[len("fixed"):]), r) for r in rows]
    return rows


def timed(ctx: Context, prompt: list[int], drafts: list[int], policy: str) -> list[float]:
    ctx.truncate(0)
    ctx.decode(prompt, logits="none")
    seconds = []
    for n, width in zip(drafts, widths(policy, drafts)):
        base = len(ctx.tokens)
        tokens = [5 + (base + i) % 300 for i in range(n + 1)]
        start = time.perf_counter()
        ctx.decode(padded(tokens, width), logits="all")  # reading the logits waits for the device
        seconds.append(time.perf_counter() - start)
        ctx.truncate(base + n + 1)
        if len(ctx.tokens) > 3000:
            ctx.truncate(len(prompt))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("rounds", type=int, nargs="?", default=300)
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1)
    args = parser.parse_args()
    ctx = Context(Model(args.target, n_gpu_layers=args.n_gpu_layers), n_ctx=4096, n_threads=4)
    prompt = [1 + (i * 7) % 500 for i in range(300)]
    for name, drafts in sequences(args.rounds).items():
        seconds: dict[str, list[float]] = {p: [] for p in POLICIES}
        for _ in range(4):
            for policy in POLICIES:
                seconds[policy] += timed(ctx, prompt, drafts, policy)[20:]
        print(f"{name}: mean rows {statistics.mean(n + 1 for n in drafts):.2f}")
        for policy in POLICIES:
            w = widths(policy, drafts)
            changes = sum(a != b for a, b in zip(w, w[1:]))
            print(f"  {policy:9s} {1e3 * statistics.mean(seconds[policy]):7.3f} ms/round (median "
                  f"{1e3 * statistics.median(seconds[policy]):.3f})  mean width {statistics.mean(w):5.2f}  "
                  f"shape changes {changes}")


if __name__ == "__main__":
    main()

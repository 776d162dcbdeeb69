#!/usr/bin/env python3
"""Two checkouts of fly-cpp on the same prompts, interleaved: k auto's speedup over each
process's own target alone, per prompt, and the ratio of the two.

    python scripts/checkouts_bench.py old=/path/to/old/.venv/bin/python new=.venv/bin/python \\
        --pair qwen-coder-f16 --dataset scripts/data/warm40.jsonl --prompts 20 --chunk 4 -- -n 128 -t 2

Each chunk of prompts runs ``fly-cpp bench --modes target,fly`` (the defaults: fly, k auto) in
either checkout, the order alternating from chunk to chunk (A B, B A, ...), so that both see the
machine alike. Each checkout keeps its own k auto evidence across its chunks (as a user's
processes do, ``FLY_CPP_EVIDENCE``); the cost cache is shared. A prompt's speedup is measured
within one process (fly against that process's target alone), so the machine's drift between
processes cancels; the table gives the geometric means and their ratio per category.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fly_cpp.bench.summary import geomean


def geo(values: list[float]) -> float:
    return geomean(values) or float("nan")


def run(python: str, out: Path, evidence: Path, args: argparse.Namespace, offset: int, extra: list[str]) -> dict:
    cmd = [python, "-m", "fly_cpp.cli.main", "bench", "--pair", args.pair, "--dataset", args.dataset,
           "--offset", str(offset), "--limit", str(args.chunk), "--modes", args.modes, "--temperature", "0",
           "--no-fidelity", "--no-plots", "-o", str(out), *extra]
    # run from outside any checkout: ``-m`` would import the package of the current folder first
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=out.parent,
                          env={**os.environ, "FLY_CPP_EVIDENCE": str(evidence)})
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\n{done.stderr[-2000:]}")
    return json.loads((out / "results.json").read_text(encoding="utf-8"))


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", metavar="LABEL=PYTHON")
    ap.add_argument("b", metavar="LABEL=PYTHON")
    ap.add_argument("--pair", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--modes", default="target,fly", help="the first is the reference; the second is compared")
    args = ap.parse_args(argv)
    if Path(args.dataset).exists():
        args.dataset = str(Path(args.dataset).resolve())
    sides = [tuple(s.split("=", 1)) for s in (args.a, args.b)]
    reference, mode = args.modes.split(",")[:2]
    work = Path(tempfile.mkdtemp(prefix="checkouts-"))
    speedup: dict[str, dict[str, tuple[str, float]]] = {label: {} for label, _ in sides}
    for n, offset in enumerate(range(0, args.prompts, args.chunk)):
        for label, python in (sides if n % 2 == 0 else sides[::-1]):
            result = run(python, work / f"{label}-{offset}", work / f"{label}-evidence.json", args, offset, extra)
            by_prompt: dict[str, dict[str, dict]] = {}
            for rec in result["records"]:
                by_prompt.setdefault(rec["prompt_id"], {})[rec["mode"]] = rec
            for pid, recs in by_prompt.items():
                ref, got = recs[reference]["stats"], recs[mode]["stats"]
                rate = lambda s: s["n_tokens"] / s["seconds"]  # noqa: E731
                speedup[label][pid] = (recs[mode]["category"], rate(got) / rate(ref))
            print(f"chunk {offset}: {label} done", file=sys.stderr, flush=True)
    (la, _), (lb, _) = sides
    cats = sorted({c for c, _ in speedup[la].values()})
    print(f"| {mode} over {reference}, per-prompt geometric mean | {' | '.join(cats)} | all |")
    print("|---|" + "---|" * (len(cats) + 1))
    for label in (la, lb):
        row = [geo([s for c, s in speedup[label].values() if c == cat]) for cat in cats]
        print(f"| {label} | {' | '.join(f'{v:.3f}' for v in row)} | {geo([s for _, s in speedup[label].values()]):.3f} |")
    ratios = {pid: speedup[lb][pid][1] / speedup[la][pid][1] for pid in speedup[la] if pid in speedup[lb]}
    row = [geo([r for pid, r in ratios.items() if speedup[la][pid][0] == cat]) for cat in cats]
    print(f"| {lb} / {la} | {' | '.join(f'{v:.3f}' for v in row)} | {geo(list(ratios.values())):.3f} |")
    print(f"\n{len(ratios)} prompts; results in {work}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Cold runs, as a user meets both tools: every prompt in a fresh process for fly-cpp too.

    python scripts/cold_bench.py --pair qwen-coder-f16 --dataset humaneval --limit 4 -n 64 -t 2 \\
        --llama-cpp-bin ~/llama-bin [--peer-k 3,5,8] [--fly-arg=--k --fly-arg=5] \\
        [--fly-config "cut draft=-d cut.gguf"] -o cold.json

Per prompt, in an order that rotates from prompt to prompt: `fly-cpp generate` with its
defaults and with `--mode target` (each a new process, no tuning flags), `llama-completion`
and `llama-speculative-simple` as its users run it (the bench's default peer set,
``fly_cpp.bench.modes.peer_modes``: k 3/5/8/16 at p-min 0 and 0.75, the n-gram lookup chained
in front of the draft model), or at each `--peer-k` with `--peer-p-min` (default 0, llama.cpp's
default), all on the same raw prompt text. Decode tokens/s of each (prompt processing and
loading left out on both sides, as `fly-cpp bench` does); medians and ratios to fly-cpp's
target-only, and fly-cpp's defaults over llama.cpp's best configuration. The cost and evidence
caches are whatever `$FLY_CPP_COSTS` / `$FLY_CPP_EVIDENCE` name (a user's are warm after their
first runs); `--first-run` adds the defaults as a first-ever run on the pair beside them (an empty
evidence file each time), `--peer LABEL` keeps only those configurations of the peer set, and
`--fly-config "LABEL=ARGS"` adds a fly-cpp configuration: the defaults run with ARGS after theirs
(a later `-d` replaces the pair's draft).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fly_cpp.bench.datasets import mixed
from fly_cpp.bench.modes import Mode, peer_modes
from fly_cpp.bench.peer import Peer
from fly_cpp.basics.errors import FlyError
from fly_cpp.models.sources import resolve

DEFAULTS, FIRST_RUN, TARGET = "fly-cpp defaults", "fly-cpp defaults, first run", "fly-cpp target"  # built-in labels

def fly(target: str, draft: str, prompt: str, n: int, threads: int, extra: list[str], first: bool = False) -> float:
    """A fresh ``fly-cpp generate``'s decode tokens/s; ``first``: as a first-ever run on the pair
    (k auto's evidence file empty; the machine's cost cache as it is)."""
    argv = [sys.executable, "-m", "fly_cpp.cli.main", "generate", "-m", target, "-d", draft, "-t", str(threads),
            "-n", str(n), "--temperature", "0", "--json", "-p", prompt, *extra]
    with tempfile.TemporaryDirectory(prefix="fly-cold-") as empty:
        env = {**os.environ, "FLY_CPP_EVIDENCE": str(Path(empty) / "evidence.json")} if first else None
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL, env=env)
    if done.returncode != 0:
        sys.exit(f"cold_bench: fly-cpp failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return float(json.loads(done.stdout)["stats"]["tokens_per_second"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair")
    ap.add_argument("-m", "--model")
    ap.add_argument("-d", "--draft")
    ap.add_argument("--dataset", default="humaneval", help="a dataset, or several comma-separated (taken in turn)")
    ap.add_argument("--limit", type=int, default=4, help="prompts of each dataset")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--llama-cpp-bin", required=True)
    ap.add_argument("--peer-k", default="")
    ap.add_argument("--peer-p-min", type=float, default=0.0)
    ap.add_argument("--peer", action="append", default=[],
                    help="only this speculative configuration of the default peer set (its label; repeatable)")
    ap.add_argument("--fly-arg", action="append", default=[], help="an extra argument for the fly-cpp defaults run")
    ap.add_argument("--first-run", action="store_true",
                    help="also the defaults as a first-ever run on the pair (an empty evidence file each time)")
    ap.add_argument("--fly-config", action="append", default=[],
                    help="another fly-cpp configuration: LABEL=ARGS, the defaults with ARGS added (repeatable)")
    ap.add_argument("-o", "--out", default="cold.json")
    a = ap.parse_args()
    extra: dict[str, list[str]] = {}
    for item in a.fly_config:
        label, sep, args = item.partition("=")
        name = f"fly-cpp {label.strip()}"
        if not sep or not label.strip():
            sys.exit(f"cold_bench: --fly-config wants LABEL=ARGS, got {item!r}")
        if name in extra or name in (DEFAULTS, FIRST_RUN, TARGET):
            sys.exit(f"cold_bench: --fly-config label {label.strip()!r} is taken")
        extra[name] = shlex.split(args)
    pair = resolve(a.model, a.draft, pair=a.pair)
    target, draft = pair.target, pair.draft
    if draft is None:
        sys.exit("cold_bench: a draft model is needed (--pair or -d)")
    peer = Peer(a.llama_cpp_bin, target, draft, n_ctx=4096, n_threads=a.threads)
    ks = [int(k) for k in a.peer_k.split(",") if k]
    spd = ({f"llama.cpp spd k {k}": Mode(f"llama.cpp spd k {k}", None, peer="speculative", k=k, p_min=a.peer_p_min)
            for k in ks} if ks else {m.label: m for m in peer_modes() if m.peer == "speculative"
                                     and (not a.peer or m.label in a.peer)})
    if a.peer and set(a.peer) - set(spd):
        sys.exit(f"cold_bench: --peer {sorted(set(a.peer) - set(spd))[0]!r} is not one of "
                 f"{', '.join(m.label for m in peer_modes() if m.peer == 'speculative')}")
    configs = [DEFAULTS, *([FIRST_RUN] if a.first_run else []), *extra, TARGET, "llama-completion", *spd]
    speeds: dict[str, list[float]] = {c: [] for c in configs}
    prompts = mixed(a.dataset, a.limit)
    for i, p in enumerate(prompts):
        order = configs[i % len(configs):] + configs[:i % len(configs)]
        for c in order:
            if c == DEFAULTS:
                speeds[c].append(fly(target, draft, p.text, a.n, a.threads, a.fly_arg))
            elif c == FIRST_RUN:
                speeds[c].append(fly(target, draft, p.text, a.n, a.threads, a.fly_arg, first=True))
            elif c in extra:
                speeds[c].append(fly(target, draft, p.text, a.n, a.threads, [*a.fly_arg, *extra[c]]))
            elif c == TARGET:
                speeds[c].append(fly(target, draft, p.text, a.n, a.threads, ["--mode", "target"]))
            elif c == "llama-completion":
                speeds[c].append(peer.run("target", p.text, a.n).tokens_per_second)
            else:
                m = spd[c]
                speeds[c].append(peer.run("speculative", p.text, a.n, int(m.k or 0), m.p_min, m.spec_type)
                                 .tokens_per_second)
        print(f"prompt {i + 1}/{len(prompts)} {p.id}: " + ", ".join(f"{c} {speeds[c][-1]:.2f}" for c in configs),
              file=sys.stderr)
    med = {c: statistics.median(v) for c, v in speeds.items()}
    best = max((c for c in configs if c.startswith("llama")), key=lambda c: med[c])
    print("| config | tok/s (median) | vs fly-cpp target |\n|---|---|---|")
    for c in configs:
        print(f"| {c} | {med[c]:.2f} | {med[c] / med[TARGET]:.2f}x |")
    for c in (c for c in configs if c.startswith("fly-cpp") and c != TARGET):
        print(f"\n{c} / llama.cpp's best ({best}): {med[c] / med[best]:.3f}x")
    Path(a.out).write_text(json.dumps({"args": vars(a), "speeds": speeds, "median": med, "best_peer": best}, indent=1))


if __name__ == "__main__":
    try:
        main()
    except FlyError as e:
        sys.exit(f"cold_bench: {e}")

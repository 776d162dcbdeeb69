#!/usr/bin/env bash
# Tokens/s of target-only, spd and fly with the target local vs split over two loopback
# rpc-servers: `fly-cpp bench` on the same prompts, the two configurations alternating ROUNDS
# times, every process on THREADS threads. Ends with a table (median tok/s over the rounds)
# and whether the RPC runs generated the local runs' tokens.
#
# usage: scripts/bench-rpc.sh OUT_DIR [ROUNDS] [bench and model options...]
#   e.g. scripts/bench-rpc.sh bench-rpc 2 --pair qwen-coder
# env:   THREADS (default 1), DATASET (spec_bench), LIMIT (10), TOKENS (64), PORT (50052: PORT, PORT+1)
set -euo pipefail

OUT=${1:?usage: scripts/bench-rpc.sh OUT_DIR [ROUNDS] [bench options]}
ROUNDS=${2:-2}
shift $(($# >= 2 ? 2 : 1))
THREADS=${THREADS:-1}
PORT=${PORT:-50052}
SERVERS="127.0.0.1:$PORT,127.0.0.1:$((PORT + 1))"
mkdir -p "$OUT"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for p in "$PORT" $((PORT + 1)); do
    fly-cpp rpc-server -H 127.0.0.1 -p "$p" -t "$THREADS" >"$OUT/rpc-server-$p.log" 2>&1 &
    pids+=($!)
done
sleep 3

run() {  # run NAME [extra options]
    local name=$1
    shift
    nice -n 10 fly-cpp bench --dataset "${DATASET:-spec_bench}" --limit "${LIMIT:-10}" -n "${TOKENS:-64}" \
        --modes target,spd,fly -t "$THREADS" --no-plots --no-fidelity --no-progress -o "$OUT/$name" "$@" >/dev/null
}
for round in $(seq 1 "$ROUNDS"); do
    run "local-$round" "$@"
    run "rpc-$round" "$@" --rpc "$SERVERS"
done

python - "$OUT" "$ROUNDS" <<'EOF'
import json
import statistics
import sys
from pathlib import Path

out, rounds = Path(sys.argv[1]), int(sys.argv[2])
runs = {(c, r): json.loads((out / f"{c}-{r}" / "results.json").read_text())
        for c in ("local", "rpc") for r in range(1, rounds + 1)}
meta = runs["local", 1]["meta"]
print(f"target {meta['target']}, draft {meta['draft']}; {meta['n_prompts']} prompts x {meta['max_tokens']} tokens, "
      f"{meta['n_threads']} thread(s); median of {rounds} alternating rounds")
print("| mode | local tok/s | 2 rpc-servers tok/s | rpc / local | tokens identical |")
print("|---|---|---|---|---|")
for mode in meta["modes"]:
    speed = {c: statistics.median(next(s["tokens_per_second"] for s in runs[c, r]["summary"] if s["mode"] == mode)
                                  for r in range(1, rounds + 1)) for c in ("local", "rpc")}
    tokens = {c: {r["prompt_id"]: r["tokens"] for r in runs[c, 1]["records"] if r["mode"] == mode}
              for c in ("local", "rpc")}
    same = sum(tokens["local"][p] == tokens["rpc"].get(p) for p in tokens["local"])
    print(f"| {mode} | {speed['local']:.1f} | {speed['rpc']:.1f} | {speed['rpc'] / speed['local']:.2f}x "
          f"| {same}/{len(tokens['local'])} |")
EOF

#!/usr/bin/env bash
# The GPU check in two device calls: llama.cpp's libraries and llama-server,
# llama-speculative-simple and llama-completion built for CUDA from the sources llama-cpp-python
# vendors, fly-cpp on them, tests/test_gpu.py, the host's row work at a real vocabulary (`fly-cpp
# profile`), then with every layer offloaded, stage by stage
# (STAGES, in order):
#   costly  the synthetic `costly` pair's single-stream bench beside llama.cpp's binaries
#   make    the synthetic `big` pair made (an 8B-class F16 target, ~14.5 GB: about a minute)
#   big     the `big` pair's single-stream bench beside llama.cpp's binaries (and fly-cpp's
#           exact option, -ub 1: the target's own greedy text, at a decode per verified row)
#           Each bench's records come back as results-PAIR.json.gz, and prices-PAIR.md holds the
#           real pair's recorded rounds (tests/data/rounds) priced at the pair's measured costs (the
#           prediction: scripts/round_prices.py) beside the pair's own rounds, priced and measured.
#   load    fly-cpp serve against llama-server under load on `costly` (-np 1/4 with 4 clients,
#           -np 8 with 8; scripts/slots_bench.py)
#
#   scripts/gpu_check.sh prepare   # here: fills .dev/ (about 12 MB; add /.dev/ to .git/info/exclude)
#   scripts/gpu_check.sh run       # there (carry .dev): build, tests, STAGES (default "costly make"): ~8 min
#   scripts/gpu_check.sh again     # there, at once after (the machine keeps /tmp while warm): STAGES
#                                  # (default "big") on the build `run` left: ~5 min
#   scripts/gpu_check.sh measure BIN   # STAGES (default "costly") with llama.cpp's binaries in BIN
#                                      # (here on the CPU, NGL=0, to try the script without a GPU)
#
# `prepare` packs the vendored llama.cpp sources without their models, docs and unused backends
# (WORK: where scripts/build-llama-cpp.sh unpacked them), llama-cpp-python's Python files, the
# wheels the device lacks (Python 3.12: the server's FastAPI stack, greenlet, gguf, diskcache)
# and the shared tinystories-656k checkpoint the costly pair grows from. The CUDA build leaves
# FlashAttention's kernels out (GGML_CUDA_FA=OFF) to fit the call: timings are not comparable
# with a full build's.
set -euo pipefail
WHEELS="fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn greenlet gguf diskcache
opentelemetry-api importlib-metadata"

stages() {  # BIN: llama.cpp's binaries; NGL: layers offloaded (-1: all); STAGES: what to run (above)
    local bin=$1 ngl=${NGL:--1} out=${OUTDIR:-/tmp/gpu-check} threads=${THREADS:-8}
    local reqs=${REQS:-32} ntok=${NTOK:-256} limit=${LIMIT:-8}
    local peer_ngl=$([ "$ngl" = 0 ] && echo 0 || echo 99)
    local fly="-ngl $ngl -ngld $ngl"
    mkdir -p "$out"
    for stage in $2; do
        t "$stage"
        case $stage in
        costly)
            python3 -m fly_cpp.cli.main models make-pair costly
            bench costly "$bin" "$out" "$ngl" "$threads" "$limit" --peer-k 3,5,8 --peer-p-min 0 ;;
        make)
            python3 -m fly_cpp.cli.main models make-pair big ;;
        big)  # the defaults, spd (k auto), fly and spd at a fixed k 16, and greedy spd exact (-ub 1: one row at a time)
            bench big "$bin" "$out" "$ngl" "$threads" "$limit" --modes target,fly,spd,fly@k16,spd@k16 \
                --peer-k 3,5,8,16 --peer-p-min 0 ;;
        load)
            python3 -m fly_cpp.cli.main models make-pair costly
            timeout 200 python3 scripts/slots_bench.py --clients 4 --requests "$reqs" --max-tokens "$ntok" --repeat 1 \
                -t "$threads" --llama-server "$bin/llama-server" \
                --config "fly-np1=fly -np 1 $fly" --config "fly-np4=fly -np 4 $fly" \
                --config "ls-np4=llama-server -np 4 -c 4096 -md -ngl $peer_ngl -ngld $peer_ngl" \
                --ratio fly-np4/fly-np1 --ratio fly-np4/ls-np4 -- --pair costly -c 4096 2>"$out/load4.log" | tee "$out/load4.md"
            timeout 120 python3 scripts/slots_bench.py --clients 8 --requests "$reqs" --max-tokens "$ntok" --repeat 1 \
                -t "$threads" --llama-server "$bin/llama-server" \
                --config "fly-np8=fly -np 8 $fly" --config "ls-np8=llama-server -np 8 -c 8192 -md -ngl $peer_ngl -ngld $peer_ngl" \
                --ratio fly-np8/ls-np8 -- --pair costly -c 8192 2>"$out/load8.log" | tee "$out/load8.md" ;;
        *) echo "unknown stage $stage (costly, make, big, load)" >&2; return 2 ;;
        esac
    done
    t measured
}

prices() {  # PAIR RESULTS: the real pair's rounds recorded at fixed k 8/12/16 (tests/data/rounds) priced at the
    # costs k auto measured in this run (the prediction), and this run's own rounds priced beside what they measured
    python3 scripts/round_prices.py tests/data/rounds/qwen-coder-k8-16.json.gz --curves-from "$2" \
        --ratio fly@k8/spd@k8 --ratio fly@k12/spd@k12 --ratio fly@k16/spd@k16 --ratio spd@k16/target || true
    echo
    python3 scripts/round_prices.py "$2" --ratio fly/spd $([ "$1" = big ] && echo --ratio fly@k16/spd@k16) || true
}

bench() {  # PAIR BIN OUT NGL THREADS LIMIT [bench options]: one interleaved single-stream bench, 128 tokens, greedy
    local pair=$1 bin=$2 out=$3 ngl=$4 threads=$5 limit=$6
    shift 6
    local modes=(--modes target,fly,spd) fidelity=(--no-fidelity)
    [[ " $* " == *" --modes "* ]] && modes=()
    [ "$pair" = big ] && fidelity=()  # the target's NLL of each mode's text (issue 52's bar on big)
    local known  # the pairs' loosening verdicts before this bench: the one it adds is this pair's
    known=$(python3 -c 'from fly_cpp.basics import jsoncache; from fly_cpp.kauto import loosening; print(" ".join(jsoncache.load(loosening.path())))')
    timeout 300 python3 -m fly_cpp.cli.main bench --pair "$pair" -ngl "$ngl" -ngld "$ngl" -t "$threads" \
        --dataset scripts/data/warm40.jsonl --limit "$limit" -n "${BENCH_N:-128}" --temperature 0 "${modes[@]}" --k auto \
        --llama-cpp-bin "$bin" "${fidelity[@]}" --no-plots -o "/tmp/bench-$pair" "$@" >"$out/bench-$pair.log" 2>&1 \
        || { tail -20 "$out/bench-$pair.log"; return 1; }
    cp "/tmp/bench-$pair/summary.md" "$out/summary-$pair.md"
    gzip -c "/tmp/bench-$pair/results.json" >"$out/results-$pair.json.gz"
    sed -n '/^| mode/,/^$/p' "/tmp/bench-$pair/summary.md"
    KNOWN="$known" PAIR="$pair" python3 -c 'import os; from fly_cpp.basics import jsoncache; from fly_cpp.kauto import loosening
known = os.environ["KNOWN"].split()
for k, v in jsoncache.load(loosening.path()).items():
    if k not in known:
        print(os.environ["PAIR"] + ": fly " + ("loosens" if v["loosen"] else "matches exactly") + ": " + v["why"])' \
        | tee "$out/loosening-$pair.txt"  # whether the defaults loosened here, and what the probe measured
    prices "$pair" "$out/results-$pair.json.gz" 2>&1 | tee "$out/prices-$pair.md"
    if [ "$pair" = big ]; then  # the exact option: greedy spd at -ub 1 writes the target's own text (and its cost)
        timeout 200 python3 -m fly_cpp.cli.main bench --pair big -ngl "$ngl" -ngld "$ngl" -t "$threads" -ub 1 \
            --dataset scripts/data/warm40.jsonl --limit "$limit" -n "${BENCH_N:-128}" --temperature 0 --modes target,spd \
            --k auto --no-fidelity --no-plots -o /tmp/bench-big-exact >"$out/bench-big-exact.log" 2>&1 \
            || tail -20 "$out/bench-big-exact.log"
        cp /tmp/bench-big-exact/summary.md "$out/summary-big-exact.md" 2>/dev/null || true
    fi
}

S=$(date +%s); t() { echo "[$(( $(date +%s) - S ))s] $*"; }
case "${1:-}" in
prepare)
    VERSION=$(python -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))')
    SRC=${WORK:-../llama-cpp-src}/llama_cpp_python-$VERSION/vendor/llama.cpp
    SITE=$(python -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent.parent)')
    SHARED=${FLY_CPP_SHARED:-../shared}
    [ -f "$SRC/CMakeLists.txt" ] || { echo "no llama.cpp sources at $SRC (scripts/build-llama-cpp.sh unpacks them)" >&2; exit 1; }
    rm -rf .dev && mkdir -p .dev/site/llama_cpp/lib .dev/shared/models .dev/whl
    # everything the libraries and the three tools build from; not the models, docs, tests, the
    # web UI's sources or the backends this build does not use
    skip=()
    for b in "$SRC"/ggml/src/ggml-*/; do
        case $(basename "$b") in ggml-cpu|ggml-cuda|ggml-rpc|ggml-blas) ;; *) skip+=(--exclude "./ggml/src/$(basename "$b")") ;; esac
    done
    tar -C "$SRC" -cJf .dev/llama.cpp.tar.xz --exclude ./models --exclude ./docs --exclude ./media --exclude ./benches \
        --exclude ./tests --exclude ./gguf-py --exclude ./tools/ui/src --exclude ./tools/ui/static \
        --exclude ./tools/ui/tests --exclude ./tools/ui/package-lock.json "${skip[@]}" .
    cp "$SITE"/llama_cpp/*.py .dev/site/llama_cpp/
    # shellcheck disable=SC2086
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_24_x86_64 -d .dev/whl $WHEELS
    cp -r "$SHARED/models/tinystories-656k" .dev/shared/models/
    du -sh .dev
    ;;
run)
    export PYTHONUNBUFFERED=1
    nvidia-smi -L
    OUTDIR=${OUT:-/tmp/gpu-check}; export OUTDIR; mkdir -p "$OUTDIR"
    mkdir -p /tmp/src && tar -C /tmp/src -xJf .dev/llama.cpp.tar.xz
    t configure
    cmake -S /tmp/src -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=on \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_RPC=ON \
        -DGGML_CCACHE=OFF >"$OUTDIR/cmake.log" 2>&1 || { tail -30 "$OUTDIR/cmake.log"; exit 1; }
    t build
    cmake --build /tmp/b -j "$(nproc)" --target llama llama-server llama-speculative-simple llama-completion \
        >"$OUTDIR/build.log" 2>&1 || { grep -m3 -A12 error "$OUTDIR/build.log"; exit 1; }
    t built
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl
    mkdir -p /tmp/site/llama_cpp/lib && cp -r .dev/site/* /tmp/site/ && cp -P /tmp/b/bin/*.so* /tmp/site/llama_cpp/lib/
    export PYTHONPATH=/tmp/site FLY_CPP_SHARED=$PWD/.dev/shared LD_LIBRARY_PATH=/tmp/b/bin:${LD_LIBRARY_PATH:-}
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUTDIR/pip.log" 2>&1 \
        || { tail -20 "$OUTDIR/pip.log"; exit 1; }
    python3 -c "from fly_cpp.backend.lib import gpu_names; from fly_cpp.backend import native; print(gpu_names(), native.status())"
    python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py
    t tests
    # the host's row work a round at the synthetic pairs' vocabulary and at a real one (Qwen2.5's),
    # on this machine's CPU: the synthetic pairs cannot show what a real vocabulary's rows cost
    { grep -m1 "model name" /proc/cpuinfo || true
      python3 -m fly_cpp.cli.main profile --vocabs 2048,151936 --ks 6,12 --repeats 5 || true; } 2>&1 | tee "$OUTDIR/profile.txt"
    stages /tmp/b/bin "${STAGES:-costly make}"
    ;;
again)
    export PYTHONUNBUFFERED=1 OUTDIR=${OUT:-/tmp/gpu-check}
    [ -x /tmp/b/bin/llama-server ] || { echo "no build in /tmp/b: run '$0 run' first, on the same warm machine" >&2; exit 1; }
    export PYTHONPATH=/tmp/site FLY_CPP_SHARED=$PWD/.dev/shared LD_LIBRARY_PATH=/tmp/b/bin:${LD_LIBRARY_PATH:-}
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUTDIR/pip.log" 2>&1 \
        || { tail -20 "$OUTDIR/pip.log"; exit 1; }
    stages /tmp/b/bin "${STAGES:-big}"
    ;;
measure)
    [ -x "${2:-}/llama-server" ] || { echo "usage: $0 measure BIN (llama.cpp's binaries)" >&2; exit 2; }
    stages "$2" "${STAGES:-costly}"
    ;;
*)
    echo "usage: $0 prepare|run|again|measure BIN" >&2
    exit 2
    ;;
esac

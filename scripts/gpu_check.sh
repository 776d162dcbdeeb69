#!/usr/bin/env bash
# The GPU check in one device call: llama.cpp's libraries and llama-server,
# llama-speculative-simple and llama-completion built for CUDA from the sources llama-cpp-python
# vendors, fly-cpp on them, tests/test_gpu.py, then the synthetic `costly` pair with every layer
# offloaded: fly-cpp serve against llama-server under load (-np 1/4 with 4 clients, -np 8 with 8;
# scripts/slots_bench.py) and the single-stream bench beside llama.cpp's binaries, with ratios.
#
#   scripts/gpu_check.sh prepare   # here: fills .dev/ (about 12 MB; add /.dev/ to .git/info/exclude)
#   scripts/gpu_check.sh run       # there (carry .dev): sized for 9 minutes on one H200/H100, 16 cores
#   scripts/gpu_check.sh measure BIN   # the measuring part alone, with llama.cpp's binaries in BIN
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

measure() {  # BIN: llama.cpp's binaries; NGL: layers offloaded (-1: all); REQS, NTOK, LIMIT: the load's size
    local bin=$1 ngl=${NGL:--1} out=${OUTDIR:-/tmp/gpu-check} threads=${THREADS:-8}
    local reqs=${REQS:-32} ntok=${NTOK:-256} limit=${LIMIT:-8}
    local peer_ngl=$([ "$ngl" = 0 ] && echo 0 || echo 99)
    mkdir -p "$out"
    python3 -m fly_cpp.cli.main models make-pair costly
    local fly="-ngl $ngl -ngld $ngl"
    t "load, 4 clients"
    timeout 200 python3 scripts/slots_bench.py --clients 4 --requests "$reqs" --max-tokens "$ntok" --repeat 1 \
        -t "$threads" --llama-server "$bin/llama-server" \
        --config "fly-np1=fly -np 1 $fly" --config "fly-np4=fly -np 4 $fly" \
        --config "ls-np4=llama-server -np 4 -c 4096 -md -ngl $peer_ngl -ngld $peer_ngl" \
        --ratio fly-np4/fly-np1 --ratio fly-np4/ls-np4 -- --pair costly -c 4096 2>"$out/load4.log" | tee "$out/load4.md"
    t "load, 8 clients"
    timeout 120 python3 scripts/slots_bench.py --clients 8 --requests "$reqs" --max-tokens "$ntok" --repeat 1 \
        -t "$threads" --llama-server "$bin/llama-server" \
        --config "fly-np8=fly -np 8 $fly" --config "ls-np8=llama-server -np 8 -c 8192 -md -ngl $peer_ngl -ngld $peer_ngl" \
        --ratio fly-np8/ls-np8 -- --pair costly -c 8192 2>"$out/load8.log" | tee "$out/load8.md"
    t "single stream"
    timeout 200 python3 -m fly_cpp.cli.main bench --pair costly -ngl "$ngl" -ngld "$ngl" -t "$threads" \
        --dataset scripts/data/warm40.jsonl --limit "$limit" -n "${BENCH_N:-128}" --temperature 0 --modes target,fly,spd --k auto \
        --llama-cpp-bin "$bin" --peer-k 3,8 --no-fidelity -o /tmp/bench >"$out/bench.log" 2>&1 \
        || { tail -20 "$out/bench.log"; return 1; }
    cp /tmp/bench/summary.md "$out/"
    sed -n '/^| mode/,/^$/p' /tmp/bench/summary.md
    t measured
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
    python3 -c "from fly_cpp.backend.lib import gpu_names; from fly_cpp import native; print(gpu_names(), native.status())"
    python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py
    t tests
    measure /tmp/b/bin
    ;;
measure)
    [ -x "${2:-}/llama-server" ] || { echo "usage: $0 measure BIN (llama.cpp's binaries)" >&2; exit 2; }
    measure "$2"
    ;;
*)
    echo "usage: $0 prepare|run|measure BIN" >&2
    exit 2
    ;;
esac

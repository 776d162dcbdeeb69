#!/usr/bin/env bash
# A GPU check in one short device call: llama.cpp's libraries built for CUDA from the sources
# llama-cpp-python vendors, fly-cpp on them, tests/test_gpu.py, and a short bench of the
# synthetic `costly` pair with every layer offloaded.
#
#   scripts/gpu_check.sh prepare   # here: fills .dev/ (about 24 MB; add /.dev/ to .git/info/exclude)
#   scripts/gpu_check.sh run       # there (carry .dev): about 4.5 minutes on one H100, 16 cores
#
# `prepare` copies the vendored llama.cpp sources without their models and unused backends
# (WORK: where scripts/build-llama-cpp.sh unpacked them), llama-cpp-python's Python files and
# the pure-Python packages the machine lacks (gguf, diskcache) from the active environment, and
# the shared tinystories-656k checkpoint the costly pair grows from. The CUDA build leaves
# FlashAttention's kernels out (GGML_CUDA_FA=OFF) to fit the call: timings are not comparable
# with a full build's.
set -euo pipefail
case "${1:-}" in
prepare)
    VERSION=$(python -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))')
    SRC=${WORK:-../llama-cpp-src}/llama_cpp_python-$VERSION/vendor/llama.cpp
    SITE=$(python -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent.parent)')
    SHARED=${FLY_CPP_SHARED:-../shared}
    [ -f "$SRC/CMakeLists.txt" ] || { echo "no llama.cpp sources at $SRC (scripts/build-llama-cpp.sh unpacks them)" >&2; exit 1; }
    rm -rf .dev && mkdir -p .dev/llama.cpp/ggml/src .dev/site/llama_cpp/lib .dev/shared/models
    cp -r "$SRC"/{CMakeLists.txt,cmake,src,include,licenses,LICENSE,vendor} .dev/llama.cpp/
    cp -r "$SRC"/ggml/{CMakeLists.txt,cmake,include} .dev/llama.cpp/ggml/
    (cd "$SRC/ggml/src" && cp -r CMakeLists.txt ./*.c ./*.cpp ./*.h ./*.in ggml-cpu ggml-cuda ggml-rpc "$OLDPWD/.dev/llama.cpp/ggml/src/")
    cp "$SITE"/llama_cpp/*.py .dev/site/llama_cpp/
    cp -r "$SITE"/gguf "$SITE"/diskcache .dev/site/
    find .dev/site -name __pycache__ -prune -exec rm -rf {} +
    cp -r "$SHARED/models/tinystories-656k" .dev/shared/models/
    du -sh .dev
    ;;
run)
    export PYTHONUNBUFFERED=1
    S=$(date +%s); t() { echo "[$(( $(date +%s) - S ))s] $*"; }
    nvidia-smi -L
    OUTDIR=${OUT:-/tmp/gpu-check}; mkdir -p "$OUTDIR"
    t configure
    cmake -S .dev/llama.cpp -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=on \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_COMMON=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_RPC=ON -DGGML_CCACHE=OFF >"$OUTDIR/cmake.log" 2>&1 \
        || { tail -30 "$OUTDIR/cmake.log"; exit 1; }
    t build
    cmake --build /tmp/b -j "$(nproc)" --target llama >"$OUTDIR/build.log" 2>&1 \
        || { grep -m3 -A12 error "$OUTDIR/build.log"; exit 1; }
    t built
    mkdir -p /tmp/site && cp -r .dev/site/* /tmp/site/ && cp -P /tmp/b/bin/*.so* /tmp/site/llama_cpp/lib/
    export PYTHONPATH=/tmp/site FLY_CPP_SHARED=$PWD/.dev/shared
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUTDIR/pip.log" 2>&1 \
        || { tail -20 "$OUTDIR/pip.log"; exit 1; }
    python3 -c "from fly_cpp._llama import gpu_names; from fly_cpp import native; print(gpu_names(), native.status())"
    python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py
    t tests
    python3 -m fly_cpp.cli.main models make-pair costly
    timeout 200 python3 -m fly_cpp.cli.main bench --pair costly -ngl -1 -t 8 --dataset humaneval --limit 8 \
        -n 128 --temperature 0 --modes target,fly,spd --k auto --no-fidelity -o /tmp/bench >"$OUTDIR/bench.log" 2>&1
    t bench
    cp /tmp/bench/summary.md "$OUTDIR/"
    sed -n '/^| mode/,/^$/p' /tmp/bench/summary.md
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac

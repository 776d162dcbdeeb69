#!/usr/bin/env bash
# Build llama.cpp's own binaries that `fly-cpp bench --llama-cpp-bin DIR` compares against:
#   llama-speculative-simple  exact-match speculative decoding (draft model + target)
#   llama-completion          target-only decoding (prints llama.cpp's perf counters)
#   ggml-rpc-server           llama.cpp's RPC backend server (its rpc-server) (`fly-cpp ... --rpc HOST:PORT`)
#   llama-server              llama.cpp's HTTP server (server comparisons, llama-server's own test suite)
# from the llama.cpp sources vendored in the llama-cpp-python sdist, so that the peer runs
# the very same llama.cpp as fly-cpp does.
#
# usage: scripts/build-llama-cpp.sh [OUT_DIR] [LLAMA_CPP_PYTHON_VERSION]
#   OUT_DIR defaults to ./llama-bin; version defaults to the installed llama-cpp-python.
# env:   JOBS (default 2), CMAKE_ARGS (extra flags, e.g. -DGGML_CUDA=on), WORK (scratch dir)
set -euo pipefail

OUT=$(realpath -m "${1:-llama-bin}")
VERSION=${2:-$(python -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))')}
JOBS=${JOBS:-2}
WORK=${WORK:-$(dirname "$OUT")/llama-cpp-src}

mkdir -p "$WORK" "$OUT"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    python -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
    tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi

# The binaries log through an asynchronous logger that is never flushed at exit (a known
# llama.cpp issue, ggml-org/llama.cpp#22142): the final statistics lines the benchmark parses
# are lost in about half the runs. Flush the log before exit; nothing else changes.
for f in "$SRC/examples/speculative-simple/speculative-simple.cpp" "$SRC/tools/completion/completion.cpp"; do
    grep -q 'common_log_flush' "$f" ||
        sed -i 's/^    llama_backend_free();$/    common_log_flush(common_log_main());\n    llama_backend_free();/' "$f"
    grep -q 'common_log_flush' "$f" || { echo "could not patch $f" >&2; exit 1; }
done

# GGML_NATIVE stays at its default (on): the binaries are tuned for this CPU, like the
# llama-cpp-python build fly-cpp runs on. Tests and the unified app are not needed.
# Except on a CPU with AMX: there the native build's AMX kernels crashed (SIGSEGV in
# ggml_backend_amx_mul_mat, any thread count) on the Qwen2.5-Coder 0.5B Q4_K_M draft (an Intel Xeon,
# 2026-12-04, llama-cpp-python 0.3.36), so the CPU's own instruction sets are named one by one
# and AMX is left out (unless CMAKE_ARGS says otherwise).
if [ -z "${CMAKE_ARGS:-}" ] && grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
                avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
        grep -qw "${pair%%:*}" /proc/cpuinfo && CMAKE_ARGS="$CMAKE_ARGS -DGGML_${pair#*:}=ON"
    done
    echo "build-llama-cpp: AMX left out of the build (native AMX kernels crashed here): $CMAKE_ARGS" >&2
fi
# shellcheck disable=SC2086
cmake -S "$SRC" -B "$WORK/build-$VERSION" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DGGML_RPC=ON \
    ${CMAKE_ARGS:-}
nice -n 19 cmake --build "$WORK/build-$VERSION" --config Release -j "$JOBS" \
    --target llama-speculative-simple llama-completion ggml-rpc-server llama-server

cp "$WORK/build-$VERSION/bin/llama-speculative-simple" "$WORK/build-$VERSION/bin/llama-completion" \
   "$WORK/build-$VERSION/bin/ggml-rpc-server" \
   "$WORK/build-$VERSION/bin/llama-server" "$OUT/"
echo "$VERSION" > "$OUT/LLAMA_CPP_PYTHON_VERSION"
echo "built into $OUT:"
ls -l "$OUT"

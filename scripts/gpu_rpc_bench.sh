#!/usr/bin/env bash
# RPC on one GPU host, in one device call: build llama.cpp's libraries with the CUDA and RPC
# backends, lend the GPU through scripts/rpc_server.py on loopback, and run warmslot's
# alternating and restore workloads with the model on the RPC device (--rpc, -dev RPC...),
# then the same with the model on the GPU directly, from the same libraries.
#
# Usage: scripts/gpu_rpc_bench.sh [MODEL_NAME] [-- EXTRA_BENCH_GPU_ARGS...]   (default qwen3-8b)
#
# The source: llama.cpp from the pinned llama-cpp-python sdist, cut to what the libraries
# need (a device call carries at most 64 MiB), made here with
#   scripts/gpu_rpc_bench.sh --pack OUT.tar.xz
# and found at $LLAMA_SRC (default .gpu/llama-src.tar.xz) on the GPU machine.
# llama-cpp-python loads the new libraries through LLAMA_CPP_LIB_PATH; only the libraries
# are built (no llama-server over RPC: its tools need the rest of the source tree).
#
# Environment: OUT (results, default bench-out/gpu), DEADLINE (seconds for everything,
# default 560), CUDA_ARCH (default 90), PORT (default 50052).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ ${1:-} == "--pack" ]]; then
    out=${2:?usage: $0 --pack OUT.tar.xz}
    src=build/src/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION:-0.3.36}/vendor/llama.cpp
    if [[ ! -f $src/CMakeLists.txt ]]; then  # the sdist, as scripts/build_llama_server.sh fetches it
        mkdir -p build/sdist build/src
        python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION:-0.3.36}" -d build/sdist >&2
        tar -xzf build/sdist/llama[-_]cpp[-_]python-"${LLAMA_CPP_PYTHON_VERSION:-0.3.36}".tar.gz -C build/src
    fi
    [[ -f $src/CMakeLists.txt ]] || { echo "no llama.cpp source at $src" >&2; exit 1; }
    tar -C "$src" -cJf "$out" CMakeLists.txt LICENSE cmake include src ggml vendor/CMakeLists.txt \
        vendor/hash vendor/miniaudio vendor/nlohmann vendor/sheredom vendor/stb
    ls -l "$out"
    exit 0
fi

start=$SECONDS
# shellcheck disable=SC1091
[[ -f .gpu/device-env.sh ]] && source .gpu/device-env.sh
export PYTHONUNBUFFERED=1
model=${1:-qwen3-8b}
[[ $# -gt 0 ]] && shift
[[ ${1:-} == "--" ]] && shift
out=${OUT:-bench-out/gpu}
port=${PORT:-50052}
libs=$PWD/build/llama.cpp-rpc-libs/bin
mkdir -p "$out"
log() { printf '[gpu_rpc_bench %ss] %s\n' "$((SECONDS - start))" "$*" | tee -a "$out/rpc-$model.log" >&2; }

if [[ ! -f $libs/libllama.so ]]; then
    mkdir -p build/llama-src-rpc
    tar -xJf "${LLAMA_SRC:-.gpu/llama-src.tar.xz}" -C build/llama-src-rpc
    cmake -S build/llama-src-rpc -B build/llama.cpp-rpc-libs -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" \
        -DGGML_RPC=ON -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
        -DCMAKE_BUILD_TYPE=Release >"$out/rpc-build.log" 2>&1
    cmake --build build/llama.cpp-rpc-libs -j"$(nproc)" --target llama >>"$out/rpc-build.log" 2>&1
    log "built llama.cpp with CUDA and RPC"
fi
# NOTE: LD_LIBRARY_PATH is searched before the libraries' RUNPATH: the new ggml must come first
export LLAMA_CPP_LIB_PATH=$libs LD_LIBRARY_PATH=$libs:${LD_LIBRARY_PATH:-}
python -c 'import llama_cpp, sys; ok = llama_cpp.llama_supports_rpc(); print("llama_supports_rpc:", ok); sys.exit(0 if ok else 1)'

gguf=/tmp/models/$model-real.gguf
vocab=()
[[ -f .gpu/ggml-vocab-qwen35.gguf ]] && vocab=(--vocab .gpu/ggml-vocab-qwen35.gguf)
python scripts/bench_models.py --model "$model" "${vocab[@]}" --out "$gguf"

CUDA_VISIBLE_DEVICES=0 python scripts/rpc_server.py "127.0.0.1:$port" >"$out/rpc-server.log" 2>&1 &
rpc_pid=$!
trap 'kill $rpc_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.2; done
python -m warmslot.server --list-devices --rpc "127.0.0.1:$port" | tee -a "$out/rpc-$model.log"
device=$(python -m warmslot.server --list-devices --rpc "127.0.0.1:$port" | grep -o '^ *RPC[0-9]*' | head -n1 | tr -d ' ')
log "RPC device: ${device:?no RPC device listed}"

half=$(( (${DEADLINE:-560} - (SECONDS - start)) / 2 ))
CUDA_VISIBLE_DEVICES=0 OUT=$out DEADLINE=$half TAG=rpc RPC=127.0.0.1:$port DEVICES=$device \
    scripts/run_gpu_bench.sh "$model" alternating restore -- --servers warmslot "$@"
left=$(( ${DEADLINE:-560} - (SECONDS - start) ))
CUDA_VISIBLE_DEVICES=0 OUT=$out DEADLINE=$left TAG=direct-same-libs \
    scripts/run_gpu_bench.sh "$model" alternating restore -- --servers warmslot "$@"
log "done"

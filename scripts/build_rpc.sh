#!/usr/bin/env bash
# llama.cpp's RPC backend, from the pinned llama-cpp-python sdist (the same llama.cpp commit
# warmslot runs), for `warmslot --rpc` and for a comparison with llama-server over RPC:
#
#   1. rpc-server and an RPC-enabled llama-server in build/llama.cpp-rpc/bin/
#      (scripts/build_llama_server.sh with -DGGML_RPC=ON);
#   2. llama-cpp-python rebuilt from that sdist with -DGGML_RPC=on, installed into the
#      environment of $PYTHON (skip with --no-python).
#
# Usage: scripts/build_rpc.sh [--no-python]
#
# Environment:
#   GPU_CMAKE_ARGS  the GPU backend for both builds, e.g. "-DGGML_CUDA=ON" (default: none, CPU)
#   PYTHON          interpreter whose environment gets llama-cpp-python (default: python3)
#   JOBS            parallel compile jobs (default: nproc)
#
# Then, on each host that lends its devices (RPC has no authentication: trusted networks only):
#   build/llama.cpp-rpc/bin/rpc-server --host 0.0.0.0 --port 50052
# and on the host that serves:
#   warmslot -m model.gguf --rpc host1:50052,host2:50052
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"
GPU_CMAKE_ARGS="${GPU_CMAKE_ARGS:-}"
export JOBS="${JOBS:-$(nproc)}"

log() { printf '[build_rpc] %s\n' "$*" >&2; }

start_ts=$(date +%s)
BUILD_DIR="$REPO_ROOT/build/llama.cpp-rpc" TARGETS="llama-server rpc-server" \
    EXTRA_CMAKE_ARGS="-DGGML_RPC=ON $GPU_CMAKE_ARGS" PYTHON="$PYTHON" \
    "$REPO_ROOT/scripts/build_llama_server.sh" >/dev/null
log "rpc-server and llama-server: $REPO_ROOT/build/llama.cpp-rpc/bin/"

if [[ "${1:-}" != "--no-python" ]]; then
    sdist="$REPO_ROOT/build/sdist/llama_cpp_python-$VERSION.tar.gz"
    log "installing llama-cpp-python $VERSION with the RPC backend into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
    # --no-cache-dir: never leave an RPC build in pip's wheel cache, where plain installs of
    # the same version would pick it up
    CMAKE_ARGS="-DGGML_RPC=on $GPU_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
        "$PYTHON" -m pip install --no-cache-dir --no-deps --force-reinstall "$sdist" >&2
    "$PYTHON" -c 'import llama_cpp, sys; ok = llama_cpp.llama_supports_rpc(); print("llama_supports_rpc:", ok); sys.exit(0 if ok else 1)'
fi
log "done in $(( $(date +%s) - start_ts ))s"

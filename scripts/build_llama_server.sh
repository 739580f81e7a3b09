#!/usr/bin/env bash
# Build llama-server and llama-bench (CPU) from the llama.cpp sources vendored
# in the pinned llama-cpp-python sdist, so that benchmarks compare warmslot with
# llama-server running the exact same llama.cpp commit.
#
# Usage: scripts/build_llama_server.sh
#
# Environment overrides:
#   LLAMA_CPP_PYTHON_VERSION  sdist version to build from (default: 0.3.36, the pinned one)
#   BUILD_ROOT                where everything goes (default: <repo>/build)
#   JOBS                      parallel compile jobs (default: nproc)
#   PYTHON                    interpreter whose pip downloads the sdist (default: python3)
#   EXTRA_CMAKE_ARGS          extra arguments for the cmake configure step
#                             (e.g. "-DGGML_CUDA=ON" for a GPU build)
#   BUILD_DIR                 the cmake build tree (default: $BUILD_ROOT/llama.cpp)
#   TARGETS                   what to build (default: "llama-server llama-bench")
#
# Layout (all under build/, which is git-ignored):
#   build/sdist/llama_cpp_python-<ver>.tar.gz   cached sdist
#   build/src/llama_cpp_python-<ver>/           extracted sdist
#   build/llama.cpp/                            cmake build tree
#   build/llama.cpp/bin/llama-server            the result
#   build/llama.cpp/BUILD_INFO                  version/commit/flags of the build
#
# Every step is skipped when its output already exists; re-running only lets
# cmake check that the targets are up to date.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# the same compiler flags as the llama-cpp-python build (AMX left out on x86-64); cmake reads
# CFLAGS/CXXFLAGS when it first configures a build tree
# shellcheck disable=SC1091
. "$REPO_ROOT/scripts/build_flags.sh"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
BUILD_ROOT="${BUILD_ROOT:-$REPO_ROOT/build}"
JOBS="${JOBS:-$(nproc)}"
SDIST_DIR="$BUILD_ROOT/sdist"
SRC_PARENT="$BUILD_ROOT/src"
SRC_DIR="$SRC_PARENT/llama_cpp_python-$VERSION"
LLAMA_SRC="$SRC_DIR/vendor/llama.cpp"
BUILD_DIR="${BUILD_DIR:-$BUILD_ROOT/llama.cpp}"
read -r -a TARGET_LIST <<< "${TARGETS:-llama-server llama-bench}"
TARBALL="$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz"

log() { printf '[build_llama_server] %s\n' "$*" >&2; }

for tool in cmake c++ tar; do
    command -v "$tool" >/dev/null 2>&1 || { log "missing required tool: $tool"; exit 1; }
done

start_ts=$(date +%s)

# 1. Fetch the sdist (source only, no dependencies).
if [[ ! -f "$TARBALL" ]]; then
    mkdir -p "$SDIST_DIR"
    log "downloading llama-cpp-python==$VERSION sdist into $SDIST_DIR"
    "${PYTHON:-python3}" -m pip download --no-binary :all: --no-deps \
        "llama-cpp-python==$VERSION" -d "$SDIST_DIR" >&2
    # pip normalises the file name; accept either spelling.
    if [[ ! -f "$TARBALL" ]]; then
        alt="$(ls "$SDIST_DIR"/llama[-_]cpp[-_]python-"$VERSION".tar.gz 2>/dev/null | head -n1 || true)"
        [[ -n "$alt" ]] || { log "sdist not found after download"; exit 1; }
        mv "$alt" "$TARBALL"
    fi
else
    log "using cached sdist $TARBALL"
fi

# 2. Extract it.
if [[ ! -f "$LLAMA_SRC/CMakeLists.txt" ]]; then
    log "extracting into $SRC_PARENT"
    mkdir -p "$SRC_PARENT"
    tmp="$(mktemp -d "$SRC_PARENT/.extract.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    tar -xzf "$TARBALL" -C "$tmp"
    top="$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -n1)"
    [[ -f "$top/vendor/llama.cpp/CMakeLists.txt" ]] || { log "no vendor/llama.cpp in sdist"; exit 1; }
    rm -rf "$SRC_DIR"
    mv "$top" "$SRC_DIR"
    rm -rf "$tmp"
    trap - EXIT
else
    log "using extracted sources $SRC_DIR"
fi

# 3. Configure.
# - No webui: LLAMA_BUILD_UI=OFF (no npm) and LLAMA_USE_PREBUILT_UI=OFF (no
#   download at build time); the server still builds, just without the UI.
# - No OpenSSL / curl: nothing in the benchmarks needs HTTPS or model download.
# - Static libraries so that bin/llama-server is self-contained.
# - GGML_NATIVE=ON: tuned for this CPU, like a source build of llama-cpp-python (with the
#   same scripts/build_flags.sh).
CMAKE_ARGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=ON
    -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_CURL=OFF
)
if [[ -n "${EXTRA_CMAKE_ARGS:-}" ]]; then
    # shellcheck disable=SC2206
    CMAKE_ARGS+=(${EXTRA_CMAKE_ARGS})
fi
GENERATOR=()
if command -v ninja >/dev/null 2>&1; then
    GENERATOR=(-G Ninja)
fi

if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
    log "configuring $BUILD_DIR"
    cmake -S "$LLAMA_SRC" -B "$BUILD_DIR" "${GENERATOR[@]}" "${CMAKE_ARGS[@]}" >&2
else
    log "already configured: $BUILD_DIR"
fi

# 4. Build (a no-op when up to date).
log "building ${TARGET_LIST[*]} with $JOBS jobs"
cmake --build "$BUILD_DIR" --target "${TARGET_LIST[@]}" -j "$JOBS" >&2

SERVER_BIN="$BUILD_DIR/bin/llama-server"
for target in "${TARGET_LIST[@]}"; do
    [[ -x "$BUILD_DIR/bin/$target" ]] || { log "build finished but $BUILD_DIR/bin/$target is missing"; exit 1; }
done

# 5. Record what was built.
commit="unknown"
if command -v git >/dev/null 2>&1; then
    commit="$(git -C "$LLAMA_SRC" rev-parse HEAD 2>/dev/null || echo unknown)"
fi
{
    echo "llama_cpp_python_version=$VERSION"
    echo "llama_cpp_commit=$commit"
    echo "llama_server_version=$("$SERVER_BIN" --version 2>&1 | tr '\n' ' ' | sed 's/ *$//')"
    echo "cmake_args=${CMAKE_ARGS[*]}"
    echo "source_dir=$LLAMA_SRC"
} > "$BUILD_DIR/BUILD_INFO"

log "done in $(( $(date +%s) - start_ts ))s (llama.cpp $commit)"
echo "$SERVER_BIN"

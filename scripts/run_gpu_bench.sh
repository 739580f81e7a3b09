#!/usr/bin/env bash
# One GPU benchmark run: write a benchmark model with bench_models.py, then compare warmslot and
# llama-server on it with bench_gpu.py. The JSON and the whole log go to $OUT.
#
# Usage: scripts/run_gpu_bench.sh MODEL_NAME WORKLOAD... [-- EXTRA_BENCH_GPU_ARGS...]
#   MODEL_NAME  qwen3-8b | qwen35-27b | qwen35-9b | gemma3-4b
#   WORKLOAD    agent alternating concurrent decode restore throughput multiagent disk messages codex sessions (words
#               or comma lists; default: the first five)
#     throughput  distinct requests from 32 clients, -np 1,4,8,16 (--tp-* flags, --profile-warmslot S)
#     multiagent  8 agents looping at once on -np 4 (--ma-* flags)
#     disk        warmslot only: restart with a 30K-token conversation on disk, spills behind a
#                 stream (--disk-* and --spill-* flags); e.g. scripts/run_gpu_bench.sh qwen35-27b disk
#     messages    a Claude-Code-shaped session through /v1/messages: a ~20K-token main agent with a
#                 billing header that changes on every request, two ~6K sub-agents in between, a
#                 compaction; -np 1 and 2 (--msg-* flags; --msg-scale 0.1 for a CPU run); today's
#                 CLI shapes (--msg-shapes current, the default) add a mid-conversation system
#                 message, thinking/effort/context management and a session-title request
#     codex       a Codex-shaped session through /v1/responses: ~10K tokens of developer messages,
#                 the CLI's tools, turns that resend the whole history (--codex-* flags;
#                 --codex-scale 0.05 for a CPU run)
#     sessions    more Claude-Code-shaped sessions than slots at once through /v1/messages: 4 on
#                 -np 2, then 16 on -np 4 (--sess-runs 4:2,16:4; --sess-* flags); wall time,
#                 computed tokens vs ideal, TTFT, warmslot's state copies per KV byte computed
# e.g. scripts/run_gpu_bench.sh qwen35-27b agent -- --nocache-turns 8
#      scripts/run_gpu_bench.sh qwen35-27b messages codex -- --msg-np 1 --codex-turns 6
#      scripts/run_gpu_bench.sh qwen3-8b throughput multiagent -- --profile-warmslot 12
#
# Environment:
#   OUT            output folder (default bench-out/gpu)
#   SCALE, LAYERS  bench_models.py --scale (default real) and --layers
#   TAG            suffix of the output names (several runs of one model and workload)
#   DEADLINE       seconds from the start by which bench_gpu.py must be done (default 540);
#                  its --time-budget is what is left after the model is written
#   CHAT_TEMPLATE  a .jinja for both servers; default: the model family's real template from
#                  .gpu/templates/ or llama.cpp's models/templates/, if present, else the GGUF's
#   PYTHON         interpreter (default python)
#   SPLIT          spread the model over several GPUs, both servers alike: a split mode
#                  (layer, row, none, tensor), e.g. SPLIT=layer; TENSOR_SPLIT (e.g. 1,1),
#                  DEVICES (e.g. CUDA0,CUDA1) and RPC (host:port,...) go along; the output
#                  names get -split-<mode> (and -rpc)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS
# shellcheck disable=SC1091
[[ -z ${LLAMACPP_CUDA_DIR:-} && -f .gpu/device-env.sh ]] && source .gpu/device-env.sh  # once: a caller may have changed its paths
export PYTHONUNBUFFERED=1

model=${1:?usage: $0 MODEL_NAME WORKLOAD... [-- ARGS]}
shift
workloads=()
while [[ $# -gt 0 && $1 != "--" ]]; do workloads+=("$1"); shift; done
[[ ${1:-} == "--" ]] && shift
wl=$(IFS=,; echo "${workloads[*]:-agent,alternating,concurrent,decode,restore}")
out=${OUT:-bench-out/gpu}
placement=()
[[ -n ${SPLIT:-} ]] && placement+=(--split-mode "$SPLIT")
[[ -n ${TENSOR_SPLIT:-} ]] && placement+=(--tensor-split "$TENSOR_SPLIT")
[[ -n ${DEVICES:-} ]] && placement+=(--device "$DEVICES")
[[ -n ${RPC:-} ]] && placement+=(--rpc "$RPC")
name="$model-${wl//,/-}${SPLIT:+-split-$SPLIT}${RPC:+-rpc}${TAG:+-$TAG}"
mkdir -p "$out" /tmp/models
gguf="/tmp/models/$model-${SCALE:-real}${LAYERS:+-$LAYERS}.gguf"

template=${CHAT_TEMPLATE:-}
if [[ -z $template ]]; then
    case $model in
        qwen3-8b|qwen3-30b-a3b) tpl=Qwen-Qwen3-0.6B.jinja ;;
        qwen35-*) tpl=Qwen3.5-4B.jinja ;;
        *) tpl= ;;
    esac
    for dir in .gpu/templates build/src/*/vendor/llama.cpp/models/templates; do
        if [[ -n $tpl && -f $dir/$tpl ]]; then template=$dir/$tpl; break; fi
    done
fi
# The tokenizer: .gpu/'s copy if there is one, else bench_models.py takes it out of the pinned
# llama-cpp-python sdist (scripts/vocab.py: ~/.cache/warmslot, build/, or pip download).
vocab=()
[[ -f .gpu/ggml-vocab-qwen35.gguf ]] && vocab=(--vocab .gpu/ggml-vocab-qwen35.gguf)

set -o pipefail
{
    echo "[run_gpu_bench] $name: model $gguf, template ${template:-the GGUF one}"
    ${PYTHON:-python} scripts/bench_models.py --model "$model" --scale "${SCALE:-real}" \
        ${LAYERS:+--layers "$LAYERS"} "${vocab[@]}" --out "$gguf"
    budget=$(( ${DEADLINE:-540} - (SECONDS - start) ))
    (( budget < 60 )) && budget=60
    echo "[run_gpu_bench] model ready after $(( SECONDS - start ))s; time budget ${budget}s"
    ${PYTHON:-python} scripts/bench_gpu.py -m "$gguf" --shape "$model" --workloads "$wl" \
        --time-budget "$budget" ${template:+--chat-template-file "$template"} "${placement[@]}" \
        --out "$out/$name.json" "$@"
} 2>&1 | tee "$out/$name.log"

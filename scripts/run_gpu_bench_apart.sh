#!/usr/bin/env bash
# The sessions workload with each server of each run on a GPU of its own, all at once, on one
# host of several GPUs: for runs that do not fit one command's time one after another. They
# share the host's CPU, RAM and PCIe, so wall times compare within one call only.
#
# Usage: OUT=DIR [LIMIT=570] [RUNS="8w 8l 27w 27l"] scripts/run_gpu_bench_apart.sh
#   RUNS, one GPU each in order: 8w / 8l  the dense 8B shape, 16 sessions on -np 4, warmslot / llama-server
#                                8wn/8w42n as 8w/8w42, with --no-cache-segments (every prompt-cache entry whole)
#                                27w / 27l the hybrid 27B shape, 4 sessions on -np 2 (--sess-shapes legacy:
#                                          llama-server's Qwen3.5 template raises on a later system message)
#                                8w42/8l42 the dense 8B shape, 4 sessions on -np 2, warmslot / llama-server
#                                m1 / m2   the models workload, both servers in turn on one GPU: the dense 8B
#                                          shape for the agents and a 0.6B one for the side requests, 1 or 2
#                                          Claude Code sessions at once
#   LIMIT  seconds from the start by which every run must be done (its --time-budget is what is
#          left after the models are written; a run still going then is written as not finished)
# Needs .gpu/ (the CUDA build and the Qwen3.5 vocabulary and template); writes DIR/NAME.json, .log
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
out=${OUT:?set OUT}
mkdir -p /tmp/models "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
vocab=(--vocab .gpu/ggml-vocab-qwen35.gguf)
runs=${RUNS:-8w 8l 27w 27l}
models=qwen3-8b
[[ " $runs " == *" 27"* ]] && models+=" qwen35-27b"
[[ " $runs " == *" m"* ]] && models+=" qwen3-0.6b"
for model in $models; do
    gguf=/tmp/models/$model-real.gguf
    [[ -f $gguf ]] || ${PYTHON:-python} scripts/bench_models.py --model "$model" --scale real "${vocab[@]}" --out "$gguf" > "$out/gen-$model.log" 2>&1 &
done
wait
echo "models ready after ${SECONDS}s"
left=$(( ${LIMIT:-570} - SECONDS ))

run_on() {  # GPU NAME ARGS...: one bench_gpu.py run in the background (the sessions workload unless ARGS say)
    local gpu=$1 name=$2
    shift 2
    CUDA_VISIBLE_DEVICES=$gpu timeout $((left + 20)) ${PYTHON:-python} scripts/bench_gpu.py --time-budget "$left" \
        --workloads sessions --out "$out/$name.json" "$@" > "$out/$name.log" 2>&1 &
}

dense=(-m /tmp/models/qwen3-8b-real.gguf --shape qwen3-8b)
hybrid=(-m /tmp/models/qwen35-27b-real.gguf --shape qwen35-27b --chat-template-file .gpu/templates/Qwen3.5-4B.jinja
        --sess-runs 4:2 --sess-shapes legacy)
gpu=0
models_run=(--workloads models --mod-small /tmp/models/qwen3-0.6b-real.gguf)
for r in $runs; do
    case $r in
        8w) run_on $gpu qwen3-8b-sessions-16on4-warmslot "${dense[@]}" --sess-runs 16:4 --servers warmslot ;;
        8wn) run_on $gpu qwen3-8b-sessions-16on4-warmslot-no-segments "${dense[@]}" --sess-runs 16:4 --servers warmslot \
                 --warmslot-args=--no-cache-segments ;;
        8l) run_on $gpu qwen3-8b-sessions-16on4-llama-server "${dense[@]}" --sess-runs 16:4 --servers llama-server ;;
        8w42) run_on $gpu qwen3-8b-sessions-4on2-warmslot "${dense[@]}" --sess-runs 4:2 --servers warmslot ;;
        8w42n) run_on $gpu qwen3-8b-sessions-4on2-warmslot-no-segments "${dense[@]}" --sess-runs 4:2 --servers warmslot \
                   --warmslot-args=--no-cache-segments ;;
        8l42) run_on $gpu qwen3-8b-sessions-4on2-llama-server "${dense[@]}" --sess-runs 4:2 --servers llama-server ;;
        m1) run_on $gpu qwen3-8b-models-1session "${dense[@]}" "${models_run[@]}" --mod-sessions 1 --log-dir "$out/logs-m1" ;;
        m2) run_on $gpu qwen3-8b-models-2sessions "${dense[@]}" "${models_run[@]}" --mod-sessions 2 --log-dir "$out/logs-m2" ;;
        27w) run_on $gpu qwen35-27b-sessions-4on2-warmslot "${hybrid[@]}" --servers warmslot ;;
        27l) run_on $gpu qwen35-27b-sessions-4on2-llama-server "${hybrid[@]}" --servers llama-server ;;
        *) echo "unknown run $r" >&2; exit 2 ;;
    esac
    gpu=$((gpu + 1))
done
wait
echo "done after ${SECONDS}s"

#!/usr/bin/env bash
# The one-GPU speed bars' runs (docs/performance.md; the FP8 rows: docs/fp8.md), each a `kogc bench` with the
# logits checked against eager in the same run, in three device calls of at most 10 minutes: run from the
# repository root with OUT set. The bars are set on an H200: OUT/gpu.txt names the GPU the call got.
#
#   bash experiments/bar_runs.sh small   # laneformer-0.5b and 2b at context 1024 with the hand-written step in one
#                                        # CUDA graph (the strongest baseline), and at 4096 (about 5 minutes)
#   bash experiments/bar_runs.sh 7b      # laneformer-7b the same (about 4 minutes)
#   bash experiments/bar_runs.sh fp8     # laneformer-2b and 7b with FP8 weights, each with the fp16 kernel's row
#                                        # in the same run (about 7 minutes)
#
# Each bench writes NAME.log (with its exit code) and NAME.json under OUT; OUT/commands.txt lists what ran.
set -u
PHASE=${1:?usage: bar_runs.sh small|7b|fp8}
: "${OUT:?set OUT to the folder the results go to}"
case $PHASE in small|7b|fp8) ;; *) echo "phase must be small, 7b or fp8, not $PHASE" >&2; exit 2 ;; esac
export PYTHONPATH=${PYTHONPATH:-$PWD} CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1

. experiments/device_step.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1

bench() {   # NAME SECONDS PRESET CONTEXT STEPS BASELINES [MORE...]
    local name=$1 limit=$2 preset=$3 context=$4 steps=$5 baselines=$6
    shift 6
    step "$name" "$limit" python3 -m kogc bench --config "$preset" --context "$context" --steps "$steps" --reps 5 \
        --baselines "$baselines" --json "$OUT/$name.json" "$@"
}

case $PHASE in
small)
    bench bench-05b-1024 150 laneformer-0.5b 1024 100 handwritten
    bench bench-05b-4096 90 laneformer-0.5b 4096 100 ''
    bench bench-2b-1024 150 laneformer-2b 1024 100 handwritten
    bench bench-2b-4096 100 laneformer-2b 4096 100 ''
    ;;
7b)
    bench bench-7b-1024 220 laneformer-7b 1024 30 handwritten
    bench bench-7b-4096 180 laneformer-7b 4096 30 ''
    ;;
fp8)
    bench bench-2b-fp8-1024 180 laneformer-2b 1024 100 '' --weights fp8
    bench bench-7b-fp8-1024 380 laneformer-7b 1024 50 '' --weights fp8
    ;;
esac

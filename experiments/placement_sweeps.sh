#!/usr/bin/env bash
# laneformer-2b's placements at contexts 1024 and 4096 (docs/design.md, Not built: queues placed for the context
# they serve): the default against the placements that CPU replays ranked first at attention x1 and x3, each variant
# checked against eager at both contexts, one device call each (at most 10 minutes): run from the repository root
# with OUT set. OUT/gpu.txt names the GPU the call got.
#
#   bash experiments/placement_sweeps.sh fp16   # four placements (about 5 minutes)
#   bash experiments/placement_sweeps.sh fp8    # five placements with FP8 weights (about 6 minutes)
#
# Each sweep writes NAME.log (with its exit code) and NAME.json under OUT; OUT/commands.txt lists what ran.
set -u
FORMAT=${1:?usage: placement_sweeps.sh fp16|fp8}
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH=${PYTHONPATH:-$PWD} CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1

case $FORMAT in
fp16)
    VARIANTS='[{}, {"lane_group_stagger": 6, "cost_context": 3072},
      {"lane_homes": 4, "lane_group_stagger": 8, "cost_context": 2048, "place_latency_us": 2.0},
      {"lane_homes": 4, "lane_group_stagger": 8, "cost_context": 3072}]'
    LIMIT=500 ;;
fp8)
    VARIANTS='[{"weights": "fp8"}, {"weights": "fp8", "cost_context": 2048},
      {"weights": "fp8", "lane_group_stagger": 8, "cost_context": 2048}, {"weights": "fp8", "lane_group_stagger": 8},
      {"weights": "fp8", "lane_group_stagger": 3.0}]'
    LIMIT=560 ;;
*) echo "format must be fp16 or fp8, not $FORMAT" >&2; exit 2 ;;
esac

. experiments/device_step.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
step "sweep-2b-placements-$FORMAT" "$LIMIT" python3 -m kogc sweep --config laneformer-2b --context 1024,4096 \
    --steps 50 --reps 5 --variants "$VARIANTS" --json "$OUT/sweep-2b-placements-$FORMAT.json"

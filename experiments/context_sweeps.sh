#!/usr/bin/env bash
# How one kernel serves contexts 1024 and 4096 (docs/design.md, Not built: queues placed for the context they serve,
# attention's splits sized for the context; docs/multi-gpu.md, at longer contexts): `kogc sweep` of the settings that
# CPU replays and the speed model ranked, each variant checked against eager at both contexts, one device call each
# (at most 10 minutes): run from the repository root with OUT set. OUT/gpu.txt names the GPU the call got.
#
#   bash experiments/context_sweeps.sh placement      # laneformer-2b, four placements (about 2 minutes on an H100)
#   bash experiments/context_sweeps.sh placement-fp8  # laneformer-2b with FP8 weights, five placements (about 2-3)
#   bash experiments/context_sweeps.sh splits         # laneformer-2b and 0.5b, 16 / 32 / 64 attention splits (about 3)
#   bash experiments/context_sweeps.sh splits-g8      # rank 0 of 8 mirrored on this GPU, the same splits (about 2)
#   bash experiments/context_sweeps.sh models-g8      # laneformer-0.5b's and 7b's rank 0 of 8 mirrored, defaults (about 3)
#   bash experiments/context_sweeps.sh profiles-g8    # the same ranks' detail profiles at 1024, bodies for `kogc predict
#                                                     # --bodies` (about 7)
#   bash experiments/context_sweeps.sh ordinary-g8    # Llama-3.2-1B's and Qwen3-0.6B's shapes cut into 8 lanes, rank 0
#                                                     # mirrored: one GPU's share of an 8-GPU step and its detail
#                                                     # profile (bodies at their widths; not yet run)
#
# Each sweep writes NAME.log (with its exit code) and NAME.json under OUT; OUT/commands.txt lists what ran.
set -u
WHAT=${1:?usage: context_sweeps.sh placement|placement-fp8|splits|splits-g8|models-g8|profiles-g8|ordinary-g8}
: "${OUT:?set OUT to the folder the results go to}"
case $WHAT in placement|placement-fp8|splits|splits-g8|models-g8|profiles-g8|ordinary-g8) ;; *)
    echo "what must be placement, placement-fp8, splits, splits-g8, models-g8, profiles-g8 or ordinary-g8, not $WHAT" >&2
    exit 2 ;; esac
export PYTHONPATH=${PYTHONPATH:-$PWD} CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1
SPLITS='[{}, {"attn_splits": 32}, {"attn_combine_width": 128, "attn_splits": 64}]'

sweep() {   # NAME SECONDS PRESET VARIANTS [MORE...]
    local name=$1 limit=$2 preset=$3 variants=$4
    shift 4
    step "$name" "$limit" python3 -m kogc sweep --config "$preset" --context 1024,4096 --steps 50 --reps 5 \
        --variants "$variants" --json "$OUT/$name.json" "$@"
}

. experiments/device_step.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1

case $WHAT in
placement)
    sweep sweep-2b-placements 500 laneformer-2b '[{}, {"lane_group_stagger": 6, "cost_context": 3072},
      {"lane_homes": 4, "lane_group_stagger": 8, "cost_context": 2048, "place_latency_us": 2.0},
      {"lane_homes": 4, "lane_group_stagger": 8, "cost_context": 3072}]' ;;
placement-fp8)
    sweep sweep-2b-fp8-placements 560 laneformer-2b '[{"weights": "fp8"}, {"weights": "fp8", "cost_context": 2048},
      {"weights": "fp8", "lane_group_stagger": 8, "cost_context": 2048}, {"weights": "fp8", "lane_group_stagger": 8},
      {"weights": "fp8", "lane_group_stagger": 3.0}]' ;;
splits)
    sweep sweep-2b-splits 300 laneformer-2b "$SPLITS"
    sweep sweep-05b-splits 240 laneformer-0.5b "$SPLITS" ;;
splits-g8)
    # {}: a rank of one lane's default, 32 splits with the last combining; 16: the output projection combining
    sweep sweep-2b-g8-splits 500 laneformer-2b '[{}, {"attn_splits": 16},
      {"attn_combine_width": 128, "attn_splits": 64}]' --gpus 8 --mirror ;;
models-g8)
    # the speed model's steps for ranks it was not fitted to (docs/multi-gpu.md, the speed model)
    sweep sweep-05b-g8 200 laneformer-0.5b '[{}]' --gpus 8 --mirror
    sweep sweep-7b-g8 300 laneformer-7b '[{}]' --gpus 8 --mirror ;;
profiles-g8)
    # bodies where HBM idles for models of other widths than laneformer-2b's (docs/multi-gpu.md, the speed model)
    for p in 0.5b 7b; do
        step "profile-$p-g8" "$([ $p = 7b ] && echo 330 || echo 150)" python3 -m kogc bench --config "laneformer-$p" \
            --gpus 8 --mirror --context 1024 --steps 30 --reps 3 --baselines '' --profile detail \
            --task-times "$OUT/task-times-$p-g8-detail.npz" --json "$OUT/profile-$p-g8.json"
    done ;;
ordinary-g8)
    # an ordinary decoder's tensor-parallel rank where HBM idles (docs/multi-gpu.md, ordinary decoders): checked
    # against eager on the model with rank 0's heads and MLP slice copied, timed beside the one-GPU kernel
    for c in llama-3.2-1b qwen3-0.6b; do
        step "profile-$c-g8" 240 python3 -m kogc bench examples/llama.py --config "$c" --max-len 2048 --gpus 8 \
            --mirror --context 1024 --steps 30 --reps 3 --profile detail \
            --task-times "$OUT/task-times-$c-g8-detail.npz" --json "$OUT/profile-$c-g8.json"
    done ;;
esac

#!/usr/bin/env bash
# laneformer-2b's placement profile measured again on the kernel of today (docs/design.md, Settings, `kind_us`): a
# profiled step of the default kernel prints its mean task bodies as a --tile-config, then `kogc sweep` places the
# same kernel with those times beside the shipped profile's (its other settings kept), at contexts 1024 and 4096,
# each checked against eager (about 3 minutes on an H200): run from the repository root with OUT set.
#   bash experiments/profile_refresh.sh        # fp16 weights: profile.log, task-times.npz, sweep-2b-refresh.*
#   bash experiments/profile_refresh.sh fp8    # FP8 weights: profile-fp8.log, task-times-fp8.npz, sweep-2b-fp8-refresh.*
# OUT/commands.txt lists what ran.
set -u
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH=${PYTHONPATH:-$PWD} CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1
. experiments/device_step.sh
case ${1:-model} in
model) SUFFIX="" BASE='{}' WEIGHTS=model ;;
fp8) SUFFIX="-fp8" BASE='{"weights": "fp8"}' WEIGHTS=fp8 ;;
*) echo "usage: profile_refresh.sh [fp8]" >&2; exit 2 ;;
esac
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt" 2>&1
step profile$SUFFIX 120 python3 -m kogc bench --config laneformer-2b --context 1024 --steps 30 --reps 3 --baselines '' \
    --weights $WEIGHTS --profile --task-times "$OUT/task-times$SUFFIX.npz"
KIND_US=$(grep -o "placement with these body times: --tile-config '.*'" "$OUT/profile$SUFFIX.log" | tail -n 1 | cut -d"'" -f2)
[ -n "$KIND_US" ] || { echo "the profile printed no body times" >&2; exit 1; }
REFRESHED=$(python3 -c 'import json, sys; v = json.loads(sys.argv[1]); v.update(json.loads(sys.argv[2])); print(json.dumps(v))' \
    "$BASE" "$KIND_US")
step sweep-2b$SUFFIX-refresh 200 python3 -m kogc sweep --config laneformer-2b --context 1024,4096 --steps 50 --reps 3 \
    --variants "[$BASE, $REFRESHED]" --json "$OUT/sweep-2b$SUFFIX-refresh.json"

#!/usr/bin/env bash
# laneformer-2b's placement profile measured again on the kernel of today (docs/design.md, Settings, `kind_us`): a
# profiled step of the default kernel prints its mean task bodies as a --tile-config, then `kogc sweep` places the
# same kernel with those times beside the shipped profile's, at contexts 1024 and 4096, each checked against eager
# (about 3 minutes on an H200): run from the repository root with OUT set. Writes profile.log, task-times.npz,
# sweep-2b-refresh.log and .json under OUT; OUT/commands.txt lists what ran.
set -u
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH=${PYTHONPATH:-$PWD} CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1
. experiments/device_step.sh
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt" 2>&1
step profile 120 python3 -m kogc bench --config laneformer-2b --context 1024 --steps 30 --reps 3 --baselines '' \
    --profile --task-times "$OUT/task-times.npz"
KIND_US=$(grep -o "placement with these body times: --tile-config '.*'" "$OUT/profile.log" | tail -n 1 | cut -d"'" -f2)
[ -n "$KIND_US" ] || { echo "the profile printed no body times" >&2; exit 1; }
step sweep-2b-refresh 200 python3 -m kogc sweep --config laneformer-2b --context 1024,4096 --steps 50 --reps 3 \
    --variants "[{}, $KIND_US]" --json "$OUT/sweep-2b-refresh.json"

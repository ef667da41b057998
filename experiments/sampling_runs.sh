#!/usr/bin/env bash
# What sampling costs a token, in one device call (about 5 minutes on an H100): run from the repository root
# with OUT set. docs/generate.md and docs/multi-gpu.md report these figures.
#
#   bash experiments/sampling_runs.sh                   # SAMPLING_TAIL=1: also the two probes (3 minutes)
#
# The GPU tests that sample first, then laneformer-2b generating 256 tokens greedily, with top-k 50 and top-p 0.9,
# and with top-p 0.9 alone (kogc run: the filtered kernel's step beside the greedy kernel's), then rank 0 of 8
# mirrored generating the same ways (experiments/mirror_sampling.py), and with SAMPLING_TAIL the top-k / top-p
# code alone on one vector (experiments/sampling_tail.py) and a rank's count task in five forms
# (experiments/count_probe.py). Each writes NAME.log under OUT (commands.txt lists
# them).
set -u
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
. experiments/device_step.sh

P=$(seq -s, 1 16)
step gpu-tests-sampling 150 python3 -m pytest -q -m gpu tests/test_gpu.py tests/test_ranks.py -k "filtered or sampl or warmed"
step run-2b-greedy 100 python3 -m kogc run --config laneformer-2b --prompt-ids "$P" --max-new-tokens 256
step run-2b-sampled 100 python3 -m kogc run --config laneformer-2b --prompt-ids "$P" --max-new-tokens 256 \
    --temperature 0.8 --top-k 50 --top-p 0.9 --seed 1
step run-2b-topp 100 python3 -m kogc run --config laneformer-2b --prompt-ids "$P" --max-new-tokens 256 \
    --temperature 0.8 --top-p 0.9 --seed 1
step mirror-sampling-g8 120 python3 experiments/mirror_sampling.py --config laneformer-2b --gpus 8 \
    --out "$OUT/mirror-sampling-g8.json"
if [ -n "${SAMPLING_TAIL:-}" ]; then
    step sampling-tail 120 python3 experiments/sampling_tail.py --out "$OUT/sampling-tail.json"
    step count-probe 90 python3 experiments/count_probe.py --out "$OUT/count-probe.json"
fi

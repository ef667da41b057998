#!/usr/bin/env bash
# Every measurement a machine of G GPUs is wanted for (docs/multi-gpu.md), in three device calls of at most
# 10 minutes: run from the repository root, with OUT set to the folder the results go to.
#
#   bash experiments/multi_gpu_run.sh G correct    # the hop probe, then kogc check: 256 steps against eager and
#                                                  # the one-GPU kernel, a 1,000-token one-launch generation,
#                                                  # repeated launches (hangs counted)
#   bash experiments/multi_gpu_run.sh G speed      # kogc bench for laneformer-2b and 7b at context 1024, each with
#                                                  # the one-GPU kernel and the TP=G stack in the same run, and the
#                                                  # ranks' waits on their peers from a profiled step
#   bash experiments/multi_gpu_run.sh G fp8        # the same with FP8 weights for laneformer-2b: checked against
#                                                  # eager and the one-GPU FP8 kernel, then timed
#   bash experiments/multi_gpu_run.sh G ordinary   # an ordinary decoder cut into G lanes (tensor parallelism):
#                                                  # Llama-3.2-1B's shapes checked, then benched with the one-GPU
#                                                  # kernel and the TP=G stack
#   bash experiments/multi_gpu_run.sh G preflight  # on ONE GPU, before a machine of G is lent: G processes
#                                                  # sharing it through the same cross-process path (the
#                                                  # launcher, symmetric memory; PyTorch's opt-in for ranks on
#                                                  # one device, a gloo group): tiny checked fp16 and FP8, an
#                                                  # ordinary decoder's tiny, the bench's path, and laneformer-0.5b's
#                                                  # sampled tokens against one GPU (the processes' kernels take
#                                                  # turns: no speed; about 7 minutes at G = 2)
#
# Each command runs under its own time limit (a step that runs over leaves the others their time) and writes
# NAME.log (with its exit code) and NAME.json under OUT; OUT/commands.txt lists what ran. On the CPU
# afterwards: kogc predict --config laneformer-2b --gpus G --remote-us <the probe's 8 KB median> against the
# bench's row (the speed model, docs/multi-gpu.md).
set -u
G=${1:?usage: multi_gpu_run.sh G correct|speed|fp8|ordinary|preflight}
PHASE=${2:?usage: multi_gpu_run.sh G correct|speed|fp8|ordinary|preflight}
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH=${PYTHONPATH:-$PWD} CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1

. experiments/device_step.sh

case $PHASE in
correct)
    nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
    # the probe needs two GPUs only: the first two of the machine
    step hop-gpus 90 env CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc-per-node 2 \
        experiments/hop_probe_gpus.py --out "$OUT/hop-gpus.json"
    step check-2b-g$G 420 python3 -m kogc check --config laneformer-2b --gpus "$G" --steps 256 --generate 1000 \
        --json "$OUT/check-2b-g$G.json"
    ;;
speed)
    step bench-2b-g$G 250 python3 -m kogc bench --config laneformer-2b --gpus "$G" --context 1024 --steps 100 \
        --reps 5 --json "$OUT/bench-2b-g$G.json"
    step bench-7b-g$G 320 python3 -m kogc bench --config laneformer-7b --gpus "$G" --context 1024 --steps 50 \
        --reps 5 --json "$OUT/bench-7b-g$G.json"
    ;;
fp8)
    step check-2b-fp8-g$G 240 python3 -m kogc check --config laneformer-2b --gpus "$G" --weights fp8 --steps 64 \
        --generate 256 --json "$OUT/check-2b-fp8-g$G.json"
    step bench-2b-fp8-g$G 300 python3 -m kogc bench --config laneformer-2b --gpus "$G" --weights fp8 --context 1024 \
        --steps 100 --reps 5 --json "$OUT/bench-2b-fp8-g$G.json"
    ;;
ordinary)
    step check-llama-1b-g$G 240 python3 -m kogc check examples/llama.py --config llama-3.2-1b --max-len 2048 \
        --gpus "$G" --steps 128 --generate 256 --json "$OUT/check-llama-1b-g$G.json"
    step bench-llama-1b-g$G 300 python3 -m kogc bench examples/llama.py --config llama-3.2-1b --max-len 2048 \
        --gpus "$G" --context 1024 --steps 100 --reps 5 --json "$OUT/bench-llama-1b-g$G.json"
    ;;
preflight)
    export TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1
    L=$(( G > 2 ? G : 2 ))  # the Laneformer tiny's lanes: at least one a rank
    for w in model fp8; do
        step check-tiny-$w-g$G-shared 180 python3 -m kogc check --config tiny --lanes $L --gpus "$G" --weights $w \
            --steps 8 --generate 8 --json "$OUT/check-tiny-$w-g$G-shared.json"
    done
    if [ "$G" -le 2 ]; then  # the Llama tiny's 2 KV heads split over 2 ranks at most
        step check-llama-tiny-g$G-shared 180 python3 -m kogc check examples/llama.py --config tiny --gpus "$G" \
            --steps 8 --generate 8 --json "$OUT/check-llama-tiny-g$G-shared.json"
    fi
    # the bench's path across processes (its times are of processes taking turns on one GPU, not a speed)
    step bench-tiny-g$G-shared 150 python3 -m kogc bench --config tiny --lanes $L --gpus "$G" --context 64 --steps 10 \
        --reps 2 --json "$OUT/bench-tiny-g$G-shared.json"
    # temperature, top-k and top-p: every rank gathers the whole logits on the device and counts them per 16-bit key
    # (an fp16 model; the tiny's fp32 logits, searched instead, are the GPU tests' two ranks side by side)
    for g in 1 "$G"; do
        step run-05b-sampled-g$g 200 python3 -m kogc run --config laneformer-0.5b --gpus "$g" --prompt-ids 1,2 \
            --max-new-tokens 32 --temperature 1.0 --top-k 50 --top-p 0.9 --seed 7
    done
    tokens() { grep -B1 -E "^[0-9]+ tokens" "$OUT/run-05b-sampled-g$1.log" | head -1; }
    if [ -n "$(tokens 1)" ] && [ "$(tokens 1)" = "$(tokens "$G")" ]; then
        echo "sampled tokens: $G processes gave the one-GPU kernel's" | tee "$OUT/sampled-tokens.txt"
    else
        echo "sampled tokens: $G processes gave [$(tokens "$G")], one GPU [$(tokens 1)]" | tee "$OUT/sampled-tokens.txt"
        exit 1
    fi
    ;;
*)
    echo "phase must be correct, speed, fp8, ordinary or preflight, not $PHASE" >&2
    exit 2
    ;;
esac

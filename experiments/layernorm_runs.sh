#!/usr/bin/env bash
# Real configs of the LayerNorm families (and of those with learned positions or ALiBi, all with LayerNorm), with random weights, on the GPU:
# each model checked against eager over 256 steps with a 128-token generation, and benched at context 1024 (GPT-2: 512) against
# the hand-written step of its forms (LayerNorm, its MLP, its parallel block, its position embedding) in one CUDA
# graph and transformers' step in one CUDA graph. About 2 minutes a model on an H200 (gpt-j-6b about 4): pass at
# most four a device call. Run from the repository root with OUT set; writes OUT/layernorm-*.
#
#   OUT=DIR bash experiments/layernorm_runs.sh                                   # pythia-1.4b stablelm-2-1.6b phi-1.5 starcoder2-3b
#   OUT=DIR bash experiments/layernorm_runs.sh gpt2-xl opt-1.3b santacoder gpt-j-6b
#   OUT=DIR bash experiments/layernorm_runs.sh phi-2 bloom-1b7 mpt-7b
set -u
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH=${PYTHONPATH:-$PWD} CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1
models=${*:-pythia-1.4b stablelm-2-1.6b phi-1.5 starcoder2-3b}
git log --oneline -1 > "$OUT/layernorm-commit.txt" 2>/dev/null
for m in $models; do
    # (GPT-2's table holds 1,024 positions: its cache and context are halved)
    case $m in gpt2*) len=1024 ctx=512 ;; *) len=2048 ctx=1024 ;; esac
    rm -rf /tmp/ln
    timeout 180 python3 experiments/make_transformers_model.py "$m" /tmp/ln >> "$OUT/layernorm-make.log" 2>&1
    timeout 150 python3 -m kogc check --model-dir /tmp/ln --max-len $len --steps 256 --generate 128 \
        --json "$OUT/layernorm-check-$m.json" > "$OUT/layernorm-check-$m.log" 2>&1
    echo "check $m: exit $?"; tail -4 "$OUT/layernorm-check-$m.log"
    timeout 150 python3 -m kogc bench --model-dir /tmp/ln --max-len $len --context $ctx --steps 50 --reps 5 \
        --baselines handwritten,cuda_graph --json "$OUT/layernorm-bench-$m.json" > "$OUT/layernorm-bench-$m.log" 2>&1
    echo "bench $m: exit $?"; tail -12 "$OUT/layernorm-bench-$m.log"
done

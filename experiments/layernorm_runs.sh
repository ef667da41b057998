#!/usr/bin/env bash
# LayerNorm families' shapes on the GPU in one device call (about 8 minutes on an H200): each model checked
# against eager over 256 steps with a 128-token generation, and benched at context 1024 against the
# hand-written step of its forms (LayerNorm, its MLP, its parallel block) in one CUDA graph and transformers'
# step in one CUDA graph. Run from the repository root with OUT set; writes OUT/layernorm-*.
set -u
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH=${PYTHONPATH:-$PWD} CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1
git log --oneline -1 > "$OUT/layernorm-commit.txt" 2>/dev/null
for m in pythia-1.4b stablelm-2-1.6b phi-1.5 starcoder2-3b; do
    rm -rf /tmp/ln
    timeout 120 python3 experiments/make_transformers_layernorm.py $m /tmp/ln >> "$OUT/layernorm-make.log" 2>&1
    timeout 150 python3 -m kogc check --model-dir /tmp/ln --max-len 2048 --steps 256 --generate 128 \
        --json "$OUT/layernorm-check-$m.json" > "$OUT/layernorm-check-$m.log" 2>&1
    echo "check $m: exit $?"; tail -4 "$OUT/layernorm-check-$m.log"
    timeout 150 python3 -m kogc bench --model-dir /tmp/ln --max-len 2048 --context 1024 --steps 50 --reps 5 \
        --baselines handwritten,cuda_graph --json "$OUT/layernorm-bench-$m.json" > "$OUT/layernorm-bench-$m.log" 2>&1
    echo "bench $m: exit $?"; tail -12 "$OUT/layernorm-bench-$m.log"
done

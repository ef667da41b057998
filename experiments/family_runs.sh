#!/usr/bin/env bash
# Gemma's shapes on the GPU in one device call (about 6 minutes on an H200; their GPU tests are in
# experiments/gpu_tests.sh 1): Gemma-3-1B's shapes checked past its 512-position window, and Gemma-3-1B's and
# Gemma-2-2B's shapes benched at context 1024 against the hand-written step and transformers' step in one CUDA
# graph. Run from the repository root with OUT set; writes OUT/gemma-*.
set -u
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH=${PYTHONPATH:-$PWD} CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1
git log --oneline -1 > "$OUT/gemma-commit.txt" 2>/dev/null
timeout 90 python3 experiments/make_transformers_gemma.py gemma-3-1b /tmp/g3 > "$OUT/gemma-make.log" 2>&1
timeout 150 python3 -m kogc check --model-dir /tmp/g3 --max-len 2048 --steps 640 --generate 128 \
    --json "$OUT/gemma-check-3-1b.json" > "$OUT/gemma-check-3-1b.log" 2>&1
echo "check gemma-3-1b past its window: exit $?"; tail -4 "$OUT/gemma-check-3-1b.log"
for m in gemma-3-1b gemma-2-2b; do
    [ "$m" = gemma-2-2b ] && { rm -rf /tmp/g3; timeout 90 python3 experiments/make_transformers_gemma.py gemma-2-2b /tmp/g3 >> "$OUT/gemma-make.log" 2>&1; }
    timeout 150 python3 -m kogc bench --model-dir /tmp/g3 --max-len 2048 --context 1024 --steps 50 --reps 5 \
        --baselines handwritten,cuda_graph --json "$OUT/gemma-bench-$m.json" > "$OUT/gemma-bench-$m.log" 2>&1
    echo "bench $m: exit $?"; tail -12 "$OUT/gemma-bench-$m.log"
done

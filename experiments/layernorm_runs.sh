#!/usr/bin/env bash
# Real configs of the LayerNorm families (and of those with learned positions or ALiBi, all with LayerNorm), with random weights, on the GPU:
# each model checked against eager over 256 steps with a 128-token generation, and benched at context 1024 (GPT-2: 512) against
# the hand-written step of its forms (LayerNorm, its MLP, its parallel block, its position embedding) in one CUDA
# graph and transformers' step in one CUDA graph. The checks (correctness only) run CHECKS at a time, 3 unless set,
# each model's kernel compiled on its own cores; the benches then run one at a time, alone on the GPU. A check takes
# about a minute and a bench about a minute on an H200 (gpt-j-6b and mpt-7b about twice that). BENCH names the models
# to bench (all of them unless set). Run from the repository root with OUT set; writes OUT/layernorm-*.
#
#   OUT=DIR bash experiments/layernorm_runs.sh                                   # pythia-1.4b stablelm-2-1.6b phi-1.5 starcoder2-3b
#   OUT=DIR bash experiments/layernorm_runs.sh gpt2-xl opt-1.3b santacoder gpt-j-6b
#   OUT=DIR BENCH="phi-2 bloom-1b7" bash experiments/layernorm_runs.sh phi-2 bloom-1b7 mpt-7b
set -u
: "${OUT:?set OUT to the folder the results go to}"
. experiments/carried_wheels.sh layernorm     # (OPT, BLOOM, MPT: transformers >= 5.24)
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1 OUT
models=${*:-pythia-1.4b stablelm-2-1.6b phi-1.5 starcoder2-3b}
git log --oneline -1 > "$OUT/layernorm-commit.txt" 2>/dev/null
# (GPT-2's table holds 1,024 positions: its cache and context are halved)
lengths() { case $1 in gpt2*) echo "1024 512" ;; *) echo "2048 1024" ;; esac; }
check() {
    m=$1; read -r len _ <<< "$(lengths "$m")"
    rm -rf "/tmp/ln-$m"
    timeout 180 python3 experiments/make_transformers_model.py "$m" "/tmp/ln-$m" > "$OUT/layernorm-make-$m.log" 2>&1
    timeout 300 python3 -m kogc check --model-dir "/tmp/ln-$m" --max-len "$len" --steps 256 --generate 128 \
        --json "$OUT/layernorm-check-$m.json" > "$OUT/layernorm-check-$m.log" 2>&1
    echo "check $m: exit $?"; tail -4 "$OUT/layernorm-check-$m.log"
}
export -f check lengths
printf '%s\n' $models | xargs -P "${CHECKS:-3}" -I{} bash -c 'check {}'
for m in ${BENCH:-$models}; do
    read -r len ctx <<< "$(lengths "$m")"
    timeout 150 python3 -m kogc bench --model-dir "/tmp/ln-$m" --max-len "$len" --context "$ctx" --steps 50 --reps 5 \
        --baselines handwritten,cuda_graph --json "$OUT/layernorm-bench-$m.json" > "$OUT/layernorm-bench-$m.log" 2>&1
    echo "bench $m: exit $?"; tail -12 "$OUT/layernorm-bench-$m.log"
done

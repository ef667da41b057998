#!/usr/bin/env bash
# Column parts (a width that is not a power of two held as two parts) against one masked part, and tiles up to
# 1.125 x tile_bytes, on ordinary models' shapes: one kogc sweep per model, with the two temporary options of this
# tree. PART=1: SmolLM2-135M, Qwen2.5-1.5B, Llama-3.2-3B; PART=2: Gemma-2-2B (random weights built on the GPU),
# Qwen2.5-0.5B (these two parts ran on a tree whose column_parts split every width where two parts hold fewer
# lanes than one, 1536 and 3072 among them); PART=3: SmolLM2-135M, Qwen2.5-1.5B, Gemma-3-1B with parts only within
# 9/8 of a power of two (this tree). Writes OUT/sweep-parts-*.
set -u
: "${OUT:?set OUT}"
export PYTHONPATH=${PYTHONPATH:-$PWD} CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1
V='[{"column_parts": false}, {}, {"tile_slack": 1.125}, {"column_parts": false}]'
sweep() {   # name, then the model arguments
    local name=$1; shift
    timeout ${LIMIT:-170} python3 -m kogc sweep "$@" --max-len 2048 --context 1024 --steps 50 --reps 3 --variants "$V" \
        --json "$OUT/sweep-parts-$name.json" > "$OUT/sweep-parts-$name.log" 2>&1
    echo "$name: exit $?"; tail -8 "$OUT/sweep-parts-$name.log"
}
if [ "${PART:-1}" = 1 ]; then
    sweep smollm2-135m examples/llama.py --config smollm2-135m
    sweep qwen2.5-1.5b examples/llama.py --config qwen2.5-1.5b
    sweep llama-3.2-3b examples/llama.py --config llama-3.2-3b
elif [ "${PART:-1}" = 2 ]; then
    timeout 90 python3 experiments/make_transformers_gemma.py gemma-2-2b /tmp/g2 > "$OUT/gemma-make.log" 2>&1
    sweep gemma-2-2b /tmp/g2
    sweep qwen2.5-0.5b examples/llama.py --config qwen2.5-0.5b
else    # two parts only within 9/8 of a power of two
    V='[{"column_parts": false}, {}, {"tile_slack": 1.125}]'
    sweep smollm2-135m-r examples/llama.py --config smollm2-135m
    sweep qwen2.5-1.5b-r examples/llama.py --config qwen2.5-1.5b
    timeout 90 python3 experiments/make_transformers_gemma.py gemma-3-1b /tmp/g3 > "$OUT/gemma-make.log" 2>&1
    sweep gemma-3-1b /tmp/g3
fi

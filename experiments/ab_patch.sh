#!/usr/bin/env bash
# Code changes against the tree they apply to, in one device call: run from the repository root with OUT set and
# each change as a patch inside the working tree (the device receives the tree, not a second checkout).
#
#   git diff > ab/change.patch && git stash          # the tree without the change, the patch beside it
#   OUT=DIR bash experiments/ab_patch.sh ab/change.patch 2 -- python3 -m kogc run --config laneformer-2b \
#       --prompt-ids 1,2,3 --max-new-tokens 256 --temperature 0.8 --top-k 50 --top-p 0.9 --seed 1
#
# Several patches, comma-separated (each against the tree alone, not stacked): ab/a.patch,ab/b.patch.
# Runs the command REPS times each way, alternating (base, change, base, change, ...: a drift of the GPU's clocks
# falls on every side), each run under its own time limit (device_step.sh, AB_LIMIT seconds, default 150), and
# prints every run's lines with tok/s or ms/token. The tree is left as it was (each patch reversed after its run).
# Logs: OUT/base-N.log and OUT/change-N.log (several patches: OUT/NAME-N.log, NAME the patch's file name without
# .patch). Tokens are compared with the base's where the command prints them.
set -u
PATCHES=${1:?usage: ab_patch.sh PATCH[,PATCH...] REPS -- COMMAND...}
REPS=${2:?usage: ab_patch.sh PATCH[,PATCH...] REPS -- COMMAND...}
shift 2
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: ab_patch.sh PATCH[,PATCH...] REPS -- COMMAND..." >&2; exit 2; }
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
. experiments/device_step.sh

IFS=, read -r -a LIST <<< "$PATCHES"
NAMES=()
for P in "${LIST[@]}"; do
    patch -s -p1 --dry-run < "$P" || { echo "ab_patch.sh: $P does not apply to this tree" >&2; exit 2; }
    if [ ${#LIST[@]} -eq 1 ]; then NAMES+=(change); else NAMES+=("$(basename "$P" .patch)"); fi
done
LIMIT=${AB_LIMIT:-150}
for i in $(seq 1 "$REPS"); do
    step "base-$i" "$LIMIT" "$@"
    for k in "${!LIST[@]}"; do
        patch -s -p1 < "${LIST[$k]}"
        step "${NAMES[$k]}-$i" "$LIMIT" "$@"
        patch -s -R -p1 < "${LIST[$k]}"
    done
done
echo "== summary"
for n in base "${NAMES[@]}"; do
    for f in "$OUT/$n"-[0-9]*.log; do
        line=$(grep -hE "^kogc +[0-9]" "$f" | head -1)   # kogc bench's own row (its header names ms/token)
        [ -n "$line" ] || line=$(grep -hE "tok/s|ms/token" "$f" | tail -1)
        echo "$(basename "$f" .log): $line"
    done
done
tokens() { grep -hE "^[0-9]+( [0-9]+)+ $" "$OUT/$1.log" | head -1; }
if [ -n "$(tokens base-1)" ]; then
    for n in "${NAMES[@]}"; do
        [ "$(tokens base-1)" = "$(tokens "$n-1")" ] && echo "tokens, $n: the same as the base's" \
            || echo "tokens, $n: DIFFER from the base's"
    done
fi

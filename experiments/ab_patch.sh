#!/usr/bin/env bash
# A code change against the tree it applies to, in one device call: run from the repository root with OUT set and
# the change as a patch inside the working tree (the device receives the tree, not a second checkout).
#
#   git diff > ab/change.patch && git stash          # the tree without the change, the patch beside it
#   OUT=DIR bash experiments/ab_patch.sh ab/change.patch 2 -- python3 -m kogc run --config laneformer-2b \
#       --prompt-ids 1,2,3 --max-new-tokens 256 --temperature 0.8 --top-k 50 --top-p 0.9 --seed 1
#
# Runs the command REPS times each way, alternating (base, change, base, change, ...: a drift of the GPU's clocks
# falls on both), each run under its own time limit (device_step.sh), and prints every run's lines with tok/s or
# ms/token. The tree is left as it was (the patch reversed after each run of the change). Logs: OUT/base-N.log,
# OUT/change-N.log. Tokens are compared between the two sides where the command prints them.
set -u
PATCH=${1:?usage: ab_patch.sh PATCH REPS -- COMMAND...}
REPS=${2:?usage: ab_patch.sh PATCH REPS -- COMMAND...}
shift 2
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: ab_patch.sh PATCH REPS -- COMMAND..." >&2; exit 2; }
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
. experiments/device_step.sh

patch -s -p1 --dry-run < "$PATCH" || { echo "ab_patch.sh: $PATCH does not apply to this tree" >&2; exit 2; }
LIMIT=${AB_LIMIT:-150}
for i in $(seq 1 "$REPS"); do
    step "base-$i" "$LIMIT" "$@"
    patch -s -p1 < "$PATCH"
    step "change-$i" "$LIMIT" "$@"
    patch -s -R -p1 < "$PATCH"
done
echo "== summary"
for f in "$OUT"/base-*.log "$OUT"/change-*.log; do
    echo "$(basename "$f" .log): $(grep -hE "tok/s|ms/token" "$f" | tail -1)"
done
tokens() { grep -hE "^[0-9]+( [0-9]+)+ $" "$OUT/$1.log" | head -1; }
if [ -n "$(tokens base-1)" ]; then
    [ "$(tokens base-1)" = "$(tokens change-1)" ] && echo "tokens: the same both ways" || echo "tokens: DIFFER"
fi

#!/usr/bin/env bash
# Sourced by the device scripts (multi_gpu_run.sh, bar_runs.sh): `step NAME SECONDS COMMAND...` runs COMMAND under
# its own time limit, so that one that runs over leaves the others their time, writes OUT/NAME.log with its exit
# code and seconds, lists the command in OUT/commands.txt and prints the log's last lines.
step() {
    local name=$1 limit=$2
    shift 2
    mkdir -p "$OUT"
    echo "$name (limit ${limit}s): $*" >> "$OUT/commands.txt"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "rc=$rc after $((SECONDS - t0)) s" >> "$OUT/$name.log"
    echo "== $name: rc=$rc after $((SECONDS - t0)) s"
    tail -n 12 "$OUT/$name.log"
}

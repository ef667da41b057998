#!/usr/bin/env bash
# The GPU tests (pytest -m gpu) in three parts, each under one device call's 10 minutes; the three can run at once in
# one call (about 6 minutes together on an H200, 2026-12-05, plus the machine's start): run from the repository root
# with OUT set.
#
#   bash experiments/gpu_tests.sh 1    # tests/test_gpu.py and tests/test_mirror.py
#   bash experiments/gpu_tests.sh 2    # tests/test_check.py, tests/test_ranks.py and tests/test_bench.py
#   bash experiments/gpu_tests.sh 3    # tests/test_gpu_families.py (LayerNorm, learned positions, ALiBi, ...)
#
# Writes OUT/gpu-tests-PART.log (pytest -v with every test's seconds) and prints its summary lines.
#
# Part 3's OPT, Falcon, BLOOM and MPT need transformers >= 5.24 (skipped with an older one): carry a newer one as
# experiments/carried_wheels.sh says.
set -u
PART=${1:?usage: gpu_tests.sh 1|2|3}
: "${OUT:?set OUT to the folder the results go to}"
. experiments/carried_wheels.sh "tests-$PART"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1
case $PART in
    1) files="tests/test_gpu.py tests/test_mirror.py" ;;
    2) files="tests/test_check.py tests/test_ranks.py tests/test_bench.py" ;;
    3) files="tests/test_gpu_families.py" ;;
    *) echo "usage: gpu_tests.sh 1|2|3" >&2; exit 2 ;;
esac
git log --oneline -1 > "$OUT/gpu-tests-$PART.log" 2>/dev/null
# shellcheck disable=SC2086
timeout 570 python3 -m pytest -m gpu $files -v --durations=0 -p no:cacheprovider >> "$OUT/gpu-tests-$PART.log" 2>&1
rc=$?
echo "exit code $rc" >> "$OUT/gpu-tests-$PART.log"
grep -E "PASSED|FAILED|ERROR|passed|failed|^E " "$OUT/gpu-tests-$PART.log" | head -40
exit $rc

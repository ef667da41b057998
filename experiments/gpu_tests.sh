#!/usr/bin/env bash
# The GPU tests (pytest -m gpu) in two parts, each under one device call's 10 minutes (the whole suite took about
# 420 s on an H200 on 2026-12-05, plus the machine's start): run from the repository root with OUT set.
#
#   bash experiments/gpu_tests.sh 1    # tests/test_gpu.py and tests/test_mirror.py
#   bash experiments/gpu_tests.sh 2    # tests/test_check.py, tests/test_ranks.py and tests/test_bench.py
#   bash experiments/gpu_tests.sh 3    # tests/test_gpu_families.py (LayerNorm, learned positions, ALiBi, ...)
#
# Writes OUT/gpu-tests-PART.log (pytest -v with every test's seconds) and prints its summary lines.
#
# Part 3's OPT, Falcon, BLOOM and MPT need transformers >= 5.24 (they are skipped with an older one). Where the
# GPU machine has an older one, carry wheels in .whl (ignored by git) and they are installed first, e.g. here:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl \
#       transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1 httpx2 httpcore2 truststore tomlkit
# (17 MB; what else the machine lacks or holds older, click, hf-xet, regex among the candidates:
# `unzip -p .whl/NAME-*.whl '*/METADATA' | grep ^Requires-Dist` against `python3 -m pip show NAME` there).
set -u
PART=${1:?usage: gpu_tests.sh 1|2|3}
: "${OUT:?set OUT to the folder the results go to}"
if compgen -G ".whl/*.whl" > /dev/null; then    # (a folder a part: the three parts may run at once)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "/tmp/site-$PART" \
        .whl/*.whl && export PYTHONPATH="/tmp/site-$PART${PYTHONPATH:+:$PYTHONPATH}" || exit 2
fi
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

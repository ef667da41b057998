#!/usr/bin/env bash
# Sourced by the GPU machine's scripts: wheels carried in .whl (ignored by git) installed into a folder of their own
# (one per caller: several may run at once) and put first on PYTHONPATH. The OPT, Falcon, BLOOM and MPT families
# need transformers >= 5.24, newer than the GPU machine's may be; fetch it and what it needs here, e.g.
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl \
#       transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1 httpx2 httpcore2 truststore tomlkit
# (17 MB; what else the machine lacks or holds older, click, hf-xet, regex among the candidates:
# `unzip -p .whl/NAME-*.whl '*/METADATA' | grep ^Requires-Dist` against `python3 -m pip show NAME` there),
# and name .whl in the device call's carry.
#   . experiments/carried_wheels.sh NAME
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "/tmp/site-$1" \
        .whl/*.whl && export PYTHONPATH="/tmp/site-$1${PYTHONPATH:+:$PYTHONPATH}" || exit 2
fi

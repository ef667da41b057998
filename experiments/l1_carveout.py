"""Probe (one H200): does the split of an SM's 256 KB between L1 and shared memory change the default
kernel's speed?

Matvec runs (docs/design.md, rejected ideas) streamed their tiles through about 69 KB of shared memory a
program and lost most where the fewest tasks used it: the LM head alone in runs +11%, all matvecs +2.5%.
That would follow if shared memory taken from L1 slowed the phases whose tiles stream through registers
(and so through L1). Here the kernel is unchanged; only the driver's preferred carveout of the kernel
(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, percent of the maximum shared memory) is set: -1 the
driver's default, the most L1 that still fits three programs (below), 100 the most shared memory. Each setting
is timed as `kogc sweep` times a variant (one launch per step from a cache at `--context`), three rounds
alternating, median ms per token.
A carveout too small for three programs' shared memory (the kernel's own, from its metadata, and the driver's
1 KB each, of an SM's 228 KB) refuses the cooperative launch ("too many blocks"), so the most L1 tried is the
smallest percentage that fits them.

    PYTHONPATH=. python experiments/l1_carveout.py examples/llama.py --config llama-3.2-1b --max-len 2048 --out $OUT/carveout.json
"""
import argparse
import ctypes
import json
import math
import statistics

import torch

import kogc
from kogc.bench.measure import time_steps
from kogc.frontend.model_file import build_model

PREFERRED_SHARED_MEMORY_CARVEOUT = 9     # CUfunction_attribute in cuda.h
SM_SHARED_KB = 228                    # an sm_90 SM's shared memory at the largest carveout


def set_carveout(libcuda, function: int, percent: int) -> None:
    err = libcuda.cuFuncSetAttribute(ctypes.c_void_p(function), PREFERRED_SHARED_MEMORY_CARVEOUT, ctypes.c_int(percent))
    if err != 0:
        raise RuntimeError(f"cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT, {percent}) returned CUresult {err}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_file")
    ap.add_argument("--config", required=True)
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    model = build_model(a.model_file, a.config, max_len=a.max_len)      # (on the CPU: kogc.compile moves it, as kogc sweep does)
    ck = kogc.compile(model)
    ck.step(1, a.context)                          # compiles and loads the kernel: its CUfunction exists
    function = ck.compiled.function
    libcuda = ctypes.CDLL("libcuda.so.1")
    need = 3 * (ck.compiled.metadata.shared + 1024)
    least = math.ceil(100 * need / (SM_SHARED_KB * 1024)) + 1
    print(f"kernel shared memory {ck.compiled.metadata.shared} B a program: the most L1 that fits is carveout {least}%")
    carveouts = (-1, least, 100)
    rows = {c: [] for c in carveouts}
    for _ in range(a.rounds):
        for c in carveouts:
            set_carveout(libcuda, function, c)
            ms = time_steps(lambda i: ck.launch(1 + i % 50, a.context + 1 + i), a.steps, a.reps, "cuda")
            rows[c] += ms
            print(f"carveout {c:>4}: {statistics.median(ms):.4f} ms per token", flush=True)
    ck.raise_if_stuck()
    res = {"shared_bytes": ck.compiled.metadata.shared, "model_file": a.model_file, "config": a.config,
           "context": a.context, "device": torch.cuda.get_device_name(),
           "ms": {str(c): v for c, v in rows.items()},
           "median_ms": {str(c): statistics.median(v) for c, v in rows.items()}}
    print(json.dumps(res["median_ms"]))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

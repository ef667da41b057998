"""On a GPU: where does the time of one launch go? Host enqueue time, device time per launch for
nsteps = 1, 2, 8, 64, the compiled kernel's registers/spills, and a per-task profile of a one-step
launch (span of the tasks vs the launch's event time). Writes $OUT/launch_probe.json.

    python scripts/launch_probe.py [--preset laneformer-2b]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]
import laneformer as lf  # noqa: E402

import kogc  # noqa: E402
from kogc.runtime.kernel import CompiledKernel, weights_of  # noqa: E402
from kogc.runtime.profile import format_summary, summarize  # noqa: E402


def events_ms(fn, reps=5):
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return sorted(out)[len(out) // 2]


def probe(ck, res, tag):
    ck.launch(1, 0)
    torch.cuda.synchronize()
    c = ck.compiled
    res[f"{tag}_regs_spills"] = [getattr(c, "n_regs", None), getattr(c, "n_spills", None)]
    t0 = time.perf_counter()
    for i in range(20):
        ck.launch(1 + i, 10 + i)
    res[f"{tag}_host_enqueue_ms"] = (time.perf_counter() - t0) * 1e3 / 20
    torch.cuda.synchronize()
    for n in (1, 2, 8, 64):
        res[f"{tag}_ms_per_step_nsteps{n}"] = events_ms(lambda: ck.launch(1, 10, nsteps=n)) / n
    res[f"{tag}_ms_per_step_20x_nsteps1"] = events_ms(lambda: [ck.launch(1 + i, 10 + i) for i in range(20)]) / 20
    ck.raise_if_stuck()
    print(tag, {k: v for k, v in res.items() if k.startswith(tag)}, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="laneformer-2b")
    args = ap.parse_args()
    model = lf.kogc_model(args.preset, seed=0)
    ck = kogc.compile(model, target="h200")
    res = {"preset": args.preset, "date": time.strftime("%Y-%m-%d %H:%M")}
    probe(ck, res, "plain")
    pk = CompiledKernel(ck.ir, ck.schedule, weights_of(model, ck.ir), "cuda", False, profile=True)
    probe(pk, res, "profiled")
    for n in (1, 2):
        pk.launch(1, 10, nsteps=n)
        torch.cuda.synchronize()
        s = summarize(pk)    # the timestamps of the launch's last step
        res[f"profile_nsteps{n}"] = s
        print(f"--- profile, last step of a {n}-step launch", flush=True)
        print(format_summary(s), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "launch_probe.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()

"""On a GPU: where does the time of one launch go? Host enqueue time, device time per launch for
nsteps = 1, 2, 8, 64, the compiled kernel's registers/spills, and a per-task profile of a one-step
launch (span of the tasks vs the launch's event time). Writes $OUT/launch_probe.json.

    python scripts/launch_probe.py [--preset laneformer-2b]
"""
from __future__ import annotations

import argparse
import statistics
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]
import laneformer as lf  # noqa: E402

import kogc  # noqa: E402
from kogc.bench.measure import time_steps, write_result  # noqa: E402
from kogc.runtime.kernel import CompiledKernel, weights_of  # noqa: E402
from kogc.runtime.profile import format_summary, summarize  # noqa: E402


def events_ms(run, steps=1, reps=5):
    """Median device ms per call of run(i) over `steps` back-to-back calls (kogc.bench's timer)."""
    return statistics.median(time_steps(run, steps, reps, "cuda", warmup=0))


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
        res[f"{tag}_ms_per_step_nsteps{n}"] = events_ms(lambda i: ck.launch(1, 10, nsteps=n)) / n
    res[f"{tag}_ms_per_step_20x_nsteps1"] = events_ms(lambda i: ck.launch(1 + i, 10 + i), steps=20)
    ck.raise_if_stuck()
    print(tag, {k: v for k, v in res.items() if k.startswith(tag)}, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="laneformer-2b")
    ap.add_argument("--host-only", action="store_true", help="stop after the host-side diagnostics")
    args = ap.parse_args()
    model = lf.kogc_model(args.preset, seed=0)
    ck = kogc.compile(model, target="h200")
    res = {"preset": args.preset, "date": time.strftime("%Y-%m-%d %H:%M")}
    probe(ck, res, "plain")
    host_diagnostics(ck, res)
    if args.host_only:
        return dump(res)
    pk = CompiledKernel(ck.ir, ck.schedule, weights_of(model, ck.ir), "cuda", False, profile=True)
    probe(pk, res, "profiled")
    for n in (1, 2):
        pk.launch(1, 10, nsteps=n)
        torch.cuda.synchronize()
        s = summarize(pk)    # the timestamps of the launch's last step
        res[f"profile_nsteps{n}"] = s
        print(f"--- profile, last step of a {n}-step launch", flush=True)
        print(format_summary(s), flush=True)
    dump(res)


def dump(res):
    write_result("launch_probe.json", res, default=str)


def host_diagnostics(ck, res):
    """Why does enqueueing one launch take milliseconds? cProfile of the launch, the bare compiled
    launcher, the function's local memory, and a launch without the cooperative attribute."""
    import cProfile
    import ctypes
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for i in range(10):
        ck.launch(1 + i, 10 + i)
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
    res["cprofile"] = buf.getvalue()
    print(buf.getvalue()[-3000:], flush=True)
    c = ck.compiled
    cuda = ctypes.CDLL("libcuda.so.1")
    for name, attr in (("local_bytes", 3), ("shared_bytes", 1), ("regs", 4), ("max_threads", 0)):
        v = ctypes.c_int()
        rc = cuda.cuFuncGetAttribute(ctypes.byref(v), attr, ctypes.c_void_p(c.function))
        res[f"func_{name}"] = v.value if rc == 0 else f"rc {rc}"
    b = ck.buffers
    args = [*b.kernel_args(), 1, 10, ck.epoch + 1, ck.watchdog_spins, 1, -1, 0, 0.0, 0, 1.0, 0,
            b.TABLE.shape[1], b.TABLE.shape[2], ck.profile, ck.schedule.sample_event]
    grid = (len(ck.schedule.queues), 1, 1)
    try:
        run = c[grid]
        t0 = time.perf_counter()
        for i in range(10):
            args[len(b.kernel_args()) + 2] = ck.epoch + 1   # epoch0
            ck.epoch += 1
            run(*args)
        res["bare_launcher_host_ms"] = (time.perf_counter() - t0) * 1e3 / 10
        torch.cuda.synchronize()
        ck.raise_if_stuck()
    except Exception as e:
        res["bare_launcher_host_ms"] = f"failed: {type(e).__name__}: {e}"
    # the same kernel without the cooperative attribute (a new compile: the option is in the key)
    def plain_launch(i):
        ck.epoch += 1
        ck.kernel[(grid[0],)](*b.kernel_args(), 1 + i, 10 + i, ck.epoch, ck.watchdog_spins, 1, -1, 0, 0.0, 0, 1.0, 0,
                              MAXLEN=b.TABLE.shape[1], ROW=b.TABLE.shape[2], PROFILE=ck.profile,
                              SAMPLE_EV=ck.schedule.sample_event, FILTER=0, num_warps=ck.num_warps)
    plain_launch(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(10):
        plain_launch(i)
    res["noncooperative_host_ms"] = (time.perf_counter() - t0) * 1e3 / 10
    torch.cuda.synchronize()
    res["noncooperative_ms_per_step_20x"] = events_ms(plain_launch, steps=20)
    ck.raise_if_stuck()
    print({k: v for k, v in res.items() if k.startswith(("func_", "bare", "noncoop"))}, flush=True)


if __name__ == "__main__":
    main()

"""What Triton's intra-kernel profiler (Proton's instrumentation backend) costs against kogc's own
`%globaltimer` stamps, on a persistent kernel shaped like a decode step: 396 programs, each streaming
its own queue of 32 KB weight tiles, three timestamps per task (start, operands arrived, end).

    python -m kogc.bench.proton_probe --out DIR        (an NVIDIA GPU; writes DIR/proton-probe.json)

Modes, each timed over the same launches (medians of --reps launches: CUDA events around the launch, and
the kernel's own span from every program's first to last `%globaltimer`, which leaves out what Proton's
launch hooks do on the host):
  none        no stamps
  globaltimer kogc's form: `%globaltimer` read after the value it waits for, one int64 store per stamp
  proton      pl.enter_scope / pl.exit_scope at the same three points, Proton's instrumentation backend
              (cycle counters into a buffer per warp, written out when the program ends), with the
              settings in PROTON_MODES
It also reports how many of Proton's records survive (its buffer is circular: a persistent program's
queue can overflow it) and what its trace's timestamps are."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl
import triton.profiler.language as pl


@triton.jit
def _now_after(dep):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep.to(tl.int32, bitcast=True)],
                                     dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _tasks(W, OUT, PROF, SPAN, n_tasks, TILE: tl.constexpr, MODE: tl.constexpr):
    """Each program streams n_tasks tiles of TILE fp16 values from its own stream, one sum per tile;
    SPAN: each program's first and last `%globaltimer` (the kernel's own time, whatever a launch's host
    side does around it)."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * n_tasks * TILE
    tl.store(SPAN + pid * 2, _now_after(tl.zeros((), tl.float32)))
    s = tl.zeros((), tl.float32)
    for i in range(n_tasks):
        if MODE == 1:
            tl.store(PROF + (pid * n_tasks + i).to(tl.int64) * 3, _now_after(tl.zeros((), tl.float32)))
        if MODE == 2:
            pl.enter_scope("operands")
        w = tl.load(W + base + i * TILE + tl.arange(0, TILE), eviction_policy="evict_first")
        s = tl.sum(w.to(tl.float32), 0)
        if MODE == 1:
            tl.store(PROF + (pid * n_tasks + i).to(tl.int64) * 3 + 1, _now_after(s))
        if MODE == 2:
            pl.exit_scope("operands")
            pl.enter_scope("body")
        tl.store(OUT + pid * n_tasks + i, s)
        if MODE == 1:
            tl.store(PROF + (pid * n_tasks + i).to(tl.int64) * 3 + 2, _now_after(s))
        if MODE == 2:
            pl.exit_scope("body")
    tl.store(SPAN + pid * 2 + 1, _now_after(s))


def _time_ms(fn) -> float:
    """fn() timed by CUDA events around it (Proton's launch hooks included)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b)


# Proton's instrumentation settings tried (proton.mode.Default fields): its default (every warp, a
# shared-memory buffer it sizes itself), one warp per program with a buffer for the whole queue,
# and the same into global memory; "cta" granularity is refused by Triton 3.6's Proton for Triton code
PROTON_MODES = {
    "default": {},
    "warp0-shared": {"sampling_strategy": "selective", "sampling_options": "0", "buffer_size": 16384},
    "warp0-global": {"sampling_strategy": "selective", "sampling_options": "0", "buffer_type": "global",
                     "buffer_size": 16384},
    "cta": {"granularity": "cta"},
}


def _span_ms(SPAN):
    span = SPAN.view(-1, 2)
    return float(span[:, 1].max() - span[:, 0].min()) / 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kogc.bench.proton_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for proton-probe.json and Proton's traces")
    ap.add_argument("--programs", type=int, default=396)
    ap.add_argument("--tasks", type=int, default=320, help="tasks per program (kogc's laneformer-2b: ~321)")
    ap.add_argument("--tile-bytes", type=int, default=32768)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--proton-modes", default=",".join(PROTON_MODES), help=f"of {', '.join(PROTON_MODES)}")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("proton_probe: needs an NVIDIA GPU", file=sys.stderr)
        return 2
    import triton.profiler as proton
    pl.enable_semantic("triton")
    os.makedirs(args.out, exist_ok=True)
    tile = args.tile_bytes // 2
    P, N = args.programs, args.tasks
    W = torch.randn(P * N * tile, device="cuda", dtype=torch.float16)
    OUT = torch.empty(P * N, device="cuda", dtype=torch.float32)
    PROF = torch.zeros(P * N * 3, device="cuda", dtype=torch.int64)
    SPAN = torch.zeros(P * 2, device="cuda", dtype=torch.int64)

    def launch(mode):
        return lambda: _tasks[(P,)](W, OUT, PROF, SPAN, N, TILE=tile, MODE=mode, num_warps=args.warps)

    def timed(mode):
        """(CUDA-event ms, in-kernel span ms), medians over the reps."""
        ev, spans = [], []
        for _ in range(args.reps):
            ev.append(_time_ms(launch(mode)))
            spans.append(_span_ms(SPAN))
        return statistics.median(ev), statistics.median(spans)

    result = {"programs": P, "tasks": N, "tile_bytes": args.tile_bytes, "warps": args.warps,
              "bytes": W.numel() * 2, "triton": triton.__version__, "gpu": torch.cuda.get_device_name(), "modes": {}}
    for name, mode in (("none", 0), ("globaltimer", 1)):
        launch(mode)()
        torch.cuda.synchronize()
        ms, span = timed(mode)
        result["modes"][name] = {"ms": ms, "span_ms": span}
        print(f"{name}: {ms:.4f} ms, in-kernel {span:.4f} ms", flush=True)
    ref = OUT.clone()
    stamps = PROF.view(P, N, 3)
    gaps = torch.diff(stamps[0].flatten().sort().values)
    result["modes"]["globaltimer"]["stamp_step_ns"] = int(gaps[gaps > 0].min())     # the timer's resolution
    result["modes"]["globaltimer"]["task_us_median"] = float((stamps[..., 2] - stamps[..., 0]).float().median()) / 1e3
    for name in [m for m in args.proton_modes.split(",") if m]:
        path = os.path.join(args.out, f"proton-{name}")
        row = {"settings": PROTON_MODES[name]}
        try:
            mode = proton.mode.Default(**PROTON_MODES[name])
            proton.start(path, backend="instrumentation", data="trace", mode=mode)
            launch(2)()                    # compile, and the trace of one launch
            torch.cuda.synchronize()
            proton.finalize()
            proton.start(path + "-timed", backend="instrumentation", data="trace", mode=mode)
            row["ms"], row["span_ms"] = timed(2)
            proton.finalize()
        except Exception as e:          # noqa: BLE001 (a refused setting is a result)
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"proton/{name}: {row['error']}", flush=True)
            result["modes"][f"proton/{name}"] = row
            continue
        row["same_sums"] = bool(torch.equal(OUT, ref))
        trace = path + ".chrome_trace"
        if os.path.exists(trace):
            with open(trace) as f:
                events = json.load(f).get("traceEvents", [])
            scoped = [e for e in events if e.get("name") in ("operands", "body")]
            row["records"] = len(scoped)
            row["records_per_warp_wanted"] = 2 * N
            row["warps_recorded"] = len({(e.get("pid"), e.get("tid")) for e in scoped})
            row["first_events"] = scoped[:3]
            row["trace_bytes"] = os.path.getsize(trace)
            for t in (trace, path + "-timed.chrome_trace"):
                if os.path.exists(t) and os.path.getsize(t) > 20e6:
                    os.remove(t)           # (only the counts are kept)
        result["modes"][f"proton/{name}"] = row
        print(f"proton/{name}: {row['ms']:.4f} ms, in-kernel {row['span_ms']:.4f} ms, {row.get('records')} records",
              flush=True)
    base = result["modes"]["none"]
    for v in result["modes"].values():
        if "ms" in v:
            v["span_vs_none"] = v["span_ms"] / base["span_ms"]
    with open(os.path.join(args.out, "proton-probe.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(json.dumps({k: round(v["span_vs_none"], 4) for k, v in result["modes"].items() if "span_vs_none" in v}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

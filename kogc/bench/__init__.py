"""`kogc bench`: kogc's monokernel against the usual stacks, on the same weights, in one run.

Rows: kogc; the model as its file writes it: PyTorch eager with a static KV cache, the whole step in ONE
CUDA graph, torch.compile(max-autotune-no-cudagraphs) + one CUDA graph, the CUDA graph with the KV
cache trimmed to the positions the bench uses (`cuda_graph_trim`: a static-shape step otherwise
attends over the whole max_position_embeddings); a hand-written step of the model's shapes (fused QKV
and gate/up, the cache trimmed: kogc.bench.handwritten) in one CUDA graph, alone and after
torch.compile: the strongest rows; and the floor (bytes that must be read
per token over the HBM read bandwidth measured in the same run: the higher of two readings, one before
kogc's row and one after the baselines). Timing: warm-up, then device events
around `steps` consecutive steps at positions context.., `reps` repetitions, median and spread.
Before it is timed, each kogc kernel's step at the context is checked against eager's on the same cache
and weights (kogc.bench.against_eager); `passed` says whether every one matched.
"""
from __future__ import annotations

import json
import sys
import time

import torch

from ..scheduler.reuse import schedules_reused
from .against_eager import check_step, format_check
from .measure import Row, bytes_per_token, check_timing, kernel_id, read_bandwidth, time_steps
from .handwritten import handwritten_graph_step, shapes_of
from .stacks import compiled_graph_step, eager_step, graph_step, trimmed_graph_step

ALL_BASELINES = ("eager", "cuda_graph", "compile", "cuda_graph_trim", "handwritten", "handwritten_compile")
# the rows that run the model as its file writes it (the others: a hand-written step of its shapes)
AS_WRITTEN = ("eager", "cuda_graph", "compile", "cuda_graph_trim")


_STARTED: list[float] = []      # when this process told its first progress line


def progress(msg: str, quiet: bool) -> None:
    """A progress line with the seconds since the first (a bench of laneformer-7b takes minutes)."""
    if not quiet:
        if not _STARTED:
            _STARTED.append(time.perf_counter())
        from ..runtime.distributed import rank_tag
        print(f"[bench{rank_tag()} {time.perf_counter() - _STARTED[0]:.0f}s] {msg}", file=sys.stderr, flush=True)


@schedules_reused()     # the profiled kernel's schedule is the timed kernel's
def run_bench(model_file: str, preset: str | None, context: int = 1024, steps: int = 100, reps: int = 5,
              baselines=ALL_BASELINES, interpret: bool = False, profile: bool | str = False, seed: int = 0,
              checkpoint: str | None = None, quiet: bool = False, overrides: dict | None = None,
              kogc_options: dict | None = None, task_times: str | None = None) -> dict:
    """Measure and return {"rows": [...], "floor": ..., "config": ...}; see format_table. With a
    profile, `task_times` (a path) also gets the profiled step's per-task stamps (kogc analyze)."""
    from ..api import compile as kogc_compile
    from ..frontend.model_file import build_model
    from ..runtime.kernel import fill_kv_from, kv_cache_buffers, randomize_kv

    device = "cpu" if interpret else "cuda"
    check_timing([context], steps, reps)
    warmup = 0 if interpret else 3          # the interpreter has nothing to warm up: each launch is seconds
    t0 = time.perf_counter()
    name = preset or checkpoint or model_file
    progress(f"building {name}" + ("" if checkpoint or not preset else f" (random weights, seed {seed})"), quiet)
    model = build_model(model_file, preset=preset, checkpoint=checkpoint, seed=seed, **(overrides or {}))
    cfg = {"model_file": model_file, "preset": preset, "model": name, "context": context, "steps": steps, "reps": reps,
           "device": "CPU (Triton interpreter)" if interpret else torch.cuda.get_device_name(),
           "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
           "weights": (kogc_options or {}).get("weights", "model")}
    progress("compiling with kogc", quiet)
    ck = kogc_compile(model, interpret=interpret, **(kogc_options or {}))
    cfg["kernel_source_sha1"] = kernel_id(ck)
    max_pos = ck.max_pos
    if context + steps + 8 > max_pos:
        raise ValueError(f"context {context} + {steps} steps does not fit the KV cache of {max_pos} positions")
    # a realistic cache: random keys and values up to `context`, the same for every stack
    gen = torch.Generator().manual_seed(seed + 1)
    randomize_kv(kv_cache_buffers(ck.ir, model), context, gen)
    fill_kv_from(ck, model)
    progress(f"checking one step against eager at position {context}", quiet)
    checks = {"kogc": check_step(ck, model, context, device)}
    rows: list[Row] = []
    readings = [] if interpret else [read_bandwidth()]
    floor_bytes = bytes_per_token(ck, context + steps // 2)

    progress(f"timing kogc ({steps} steps x {reps})", quiet)
    rows.append(Row("kogc" + (" (interpreter, CPU)" if interpret else ""),
                    time_steps(lambda i: ck.launch(1 + i % 100, context + i), steps, reps, device, warmup)))
    progress(f"kogc: {rows[-1].ms} ms/token", quiet)
    # the same steps as one generation in ONE launch (what `generate` and `kogc run` do): no launch gap
    # between steps, each step's token fed back on the GPU
    progress(f"timing kogc generating {steps} tokens in one launch (x {reps})", quiet)
    rows.append(Row("kogc generate (one launch" + (", interpreter, CPU)" if interpret else ")"),
                    [ms / steps for ms in time_steps(lambda i: ck.launch(1, context, nsteps=steps), 1, reps, device,
                                                     warmup=min(warmup, 1))]))
    progress(f"kogc generate: {rows[-1].ms} ms/token", quiet)
    ck.raise_if_stuck()
    fp8 = (kogc_options or {}).get("weights", "model") != "model"
    # the baselines stream the model's own weights: beside an FP8 kernel, their floor is of those bytes
    baseline_extra = {"floor_bytes": bytes_per_token(ck, context + steps // 2, as_model=True)} if fp8 else {}
    if fp8:
        # the same model streaming its own weights, in the same run: what FP8 buys
        progress("timing kogc with the model's weights", quiet)
        full = kogc_compile(model, interpret=interpret, **{**kogc_options, "weights": "model"})
        fill_kv_from(full, model)
        checks["kogc, model's weights"] = check_step(full, model, context, device)
        rows.append(Row("kogc, model's weights" + (" (interpreter, CPU)" if interpret else ""),
                        time_steps(lambda i: full.launch(1 + i % 100, context + i), steps, reps, device, warmup),
                        extra={"floor_bytes": bytes_per_token(full, context + steps // 2),
                               "kernel_source_sha1": kernel_id(full)}))
        progress(f"kogc, model's weights: {rows[-1].ms} ms/token", quiet)
        full = None
    prof = None
    if profile and not interpret:
        from ..runtime.profile import format_summary, summarize
        progress("profiling one kogc step", quiet)
        pk = kogc_compile(model, profile=profile, **(kogc_options or {}))
        fill_kv_from(pk, model)
        for i in range(3):
            pk.launch(1, context + i)
        torch.cuda.synchronize()
        prof = summarize(pk)
        prof["text"] = format_summary(prof)
        if task_times:
            from ..analysis.stamps import save_stamps
            prof["task_times"] = save_stamps(pk, task_times, model_file=model_file, preset=preset,
                                             checkpoint=checkpoint, overrides=overrides)
            progress(f"wrote the profiled step's task times to {prof['task_times']}", quiet)
        del pk
    shapes = shapes_of(ck.schedule)
    ck = None   # free its buffers before the baselines run
    if not interpret:
        torch.cuda.empty_cache()
    model = model.to(device)
    for name in baselines:
        if interpret and name != "eager":
            continue
        progress(f"timing {name}", quiet)
        n = min(steps, 20) if name == "eager" else steps
        make = {"eager": eager_step, "cuda_graph": graph_step, "compile": compiled_graph_step,
                "cuda_graph_trim": lambda m, d, c: trimmed_graph_step(m, d, c, _round_up(c + steps + 1, 64)),
                "handwritten": lambda m, d, c: handwritten_graph_step(shapes, c, d, seed=seed),
                "handwritten_compile": lambda m, d, c: handwritten_graph_step(shapes, c, d, True, seed)}[name]
        try:
            run = make(model, device, context)
            rows.append(Row(name + (" (CPU)" if interpret else ""), time_steps(run, n, reps, device, warmup),
                            extra=dict(baseline_extra)))
            progress(f"{name}: {rows[-1].ms} ms/token", quiet)
        except Exception as e:  # a baseline that cannot run is reported, not fatal
            rows.append(Row(name, [], error=f"{type(e).__name__}: {str(e)[:200]}"))
    if readings:
        # a second reading after the baselines: one machine read 3.89-4.19 TB/s from one run to the next, and
        # the floor takes the higher of the two (the bar is against what the machine can do)
        try:
            torch.cuda.empty_cache()
            readings.append(read_bandwidth())
        except RuntimeError as e:     # a baseline that broke the device must not cost the table
            progress(f"second bandwidth reading failed ({str(e)[:100]}); the floor uses the first", quiet)
    bw = max(readings, default=None)
    if prof and prof.get("task_times") and bw:        # the file names the bandwidth of the floor
        from ..analysis.stamps import record_read_bandwidth
        record_read_bandwidth(prof["task_times"], bw)
    result = {"config": cfg, "floor": {"bytes_per_token": floor_bytes, "read_bw_Bps": bw,
                                       "read_bw_readings_Bps": readings,
                                       "ms": floor_bytes / bw * 1e3 if bw else None},
              "rows": [r.to_dict(floor_bytes) for r in rows], "checks": checks,
              "passed": all(c["ok"] for c in checks.values()), "seconds": time.perf_counter() - t0}
    if prof is not None:
        result["profile"] = prof
    return result


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def format_table(res: dict) -> str:
    rows = res["rows"]
    graph = next((r for r in rows if r["name"] == "cuda_graph" and r.get("ms_median")), None)
    trim = next((r for r in rows if r["name"] == "cuda_graph_trim" and r.get("ms_median")), None)
    floor_ms = res["floor"]["ms"]
    c = res["config"]
    lines = [f"{c.get('model') or c['preset']} context {c['context']}, {c['steps']} steps x {c['reps']} reps "
             f"on {c['device']} ({c['date']})"
             + (f", weights {c['weights']}" if c.get("weights", "model") != "model" else ""),
             f"floor: {res['floor']['bytes_per_token'] / 1e9:.3f} GB per token"
             + (f" at {res['floor']['read_bw_Bps'] / 1e12:.2f} TB/s measured read bandwidth"
                + _readings(res["floor"]) + f" = {floor_ms:.3f} ms "
                f"({1e3 / floor_ms:.0f} tok/s)" if floor_ms else " (no bandwidth on CPU)"),
             f"{'stack':36} {'ms/token':>9} {'spread':>15} {'tok/s':>9} {'TB/s':>6} {'vs graph':>8} {'of floor':>8}"]
    for r in rows:
        if not r.get("ms_median"):
            lines.append(f"{label(r['name']):36} failed: {r.get('error')}")
            continue
        vs = f"{graph['ms_median'] / r['ms_median']:.2f}x" if graph else "-"
        # one decimal: a whole percent would round 69.7% up to 70%; a row with its own floor (the model's
        # weights beside an FP8 kernel: more bytes) against that one
        own = floor_ms * r["floor_bytes"] / res["floor"]["bytes_per_token"] if floor_ms and "floor_bytes" in r else floor_ms
        of = f"{own / r['ms_median']:.1%}" if floor_ms else "-"
        lines.append(f"{label(r['name']):36} {r['ms_median']:9.3f} {r['ms_min']:7.3f}-{r['ms_max']:<7.3f} "
                     f"{r['tok_per_s']:9.1f} {r['TBps']:6.2f} {vs:>8} {of:>8}")
    kogc_row = next((r for r in rows if r["name"].startswith("kogc") and r.get("ms_median")), None)
    if trim and kogc_row:
        lines.append(f"kogc vs the trimmed-cache CUDA graph: {trim['ms_median'] / kogc_row['ms_median']:.2f}x")
    others = [r for r in rows if r.get("ms_median") and not r["name"].startswith("kogc")]
    if others and kogc_row:
        best = min(others, key=lambda r: r["ms_median"])
        lines.append(f"kogc vs the strongest baseline ({label(best['name'])}): "
                     f"{best['ms_median'] / kogc_row['ms_median']:.2f}x")
    full = next((r for r in rows if r["name"].startswith("kogc, model's weights") and r.get("ms_median")), None)
    if full and kogc_row:
        lines.append(f"kogc {c.get('weights')} vs kogc with the model's weights: "
                     f"{full['ms_median'] / kogc_row['ms_median']:.2f}x")
    for name, check in res.get("checks", {}).items():
        lines.append(format_check(name, check))
    if "profile" in res:
        lines.append(res["profile"]["text"])
    return "\n".join(lines)


def label(name: str) -> str:
    """A row's name as the table prints it: the model-as-written rows say so."""
    if name in AS_WRITTEN:
        return f"{name} (model as written)"
    return {"handwritten": "hand-written step, CUDA graph",
            "handwritten_compile": "hand-written, compile + graph"}.get(name, name)


def _readings(floor: dict) -> str:
    """' (the higher of a, b TB/s)' when the run read the bandwidth more than once."""
    r = floor.get("read_bw_readings_Bps") or []
    return f" (the higher of {', '.join(f'{x / 1e12:.2f}' for x in r)})" if len(r) > 1 else ""


def write_json(res: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


__all__ = ["run_bench", "format_table", "write_json", "ALL_BASELINES"]

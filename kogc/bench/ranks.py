"""`kogc bench --gpus G`: delayed tensor parallelism timed, with in the same run the one-GPU kogc kernel,
the Megatron-style TP=G stack (NCCL all-reduce, the whole step in one CUDA graph; across GPUs only)
and the floor per GPU; and from a profiled step, the time the ranks' programs spent waiting on their
peers' flags.

Run as G processes (one per GPU: `kogc bench --gpus G` starts them; under torchrun each process runs
this) or, with `--one-gpu`, every rank on this one GPU (a test of the protocol: the ranks share the
GPU's bandwidth, so the floor is the whole model's), or, with `--mirror`, rank 0 alone on this GPU
with every peer mirrored by itself (kogc.runtime.ranks.mirror_rank): one GPU's share of a G-GPU step
with free exchanges and peers in perfect step, the fastest G GPUs can run the schedule; its profiled
step is summarised and can be written for `kogc analyze` (--task-times)."""
from __future__ import annotations

import time

import torch

from ..scheduler.reuse import schedules_reused
from .against_eager import check_step, mirror_lane_groups
from .measure import Row, bytes_per_token, check_timing, read_bandwidth, time_steps


def _kernels(ck):
    """The rank kernels this process runs (all of them on one GPU, its own across GPUs, the mirrored one)."""
    if hasattr(ck, "kernels"):
        return ck.kernels
    from ..runtime.kernel import CompiledKernel
    return [ck] if isinstance(ck, CompiledKernel) else [ck.kernel]


def _launcher(ck):
    """launch(token, pos, nsteps) for every rank this process runs."""
    if hasattr(ck, "kernels"):
        return lambda tok, pos, n=1: ck._launch_all(tok, pos, nsteps=n)
    k = _kernels(ck)[0]
    return lambda tok, pos, n=1: k.launch(tok, pos, nsteps=n)


def remote_waits(kernels) -> dict:
    """From a profiled step: per rank, the program-microseconds spent in waits on peers' counters
    (start to after the waits, for tasks that wait on a peer), and the longest such wait."""
    out = []
    for k in kernels:
        s = k.schedule
        prof = k.buffers.PROF.cpu()
        total, longest, n = 0.0, 0.0, 0
        for p, q in enumerate(s.queues):
            for slot, tid in enumerate(q):
                if any(g >= s.first_remote for g, _ in s.tasks[tid].waits):
                    us = float(prof[p, slot, 1] - prof[p, slot, 0]) / 1e3
                    total, longest, n = total + us, max(longest, us), n + 1
        out.append({"rank": s.rank, "tasks": n, "program_us": total, "longest_us": longest})
    return {"per_rank": out}


@schedules_reused()     # the profiled kernel's schedule is the timed kernel's
def run_bench_ranks(model_file: str, preset: str | None, gpus: int, one_gpu: bool | str, context: int = 1024,
                    steps: int = 100, reps: int = 5, seed: int = 0, checkpoint: str | None = None,
                    overrides: dict | None = None, kogc_options: dict | None = None, quiet: bool = False,
                    progress=None, profile: bool | str = True, task_times: str | None = None) -> dict:
    """one_gpu: False (a process per GPU), True (every rank on this GPU) or "mirror". profile: how the
    profiled step is recorded (True or "detail"); task_times: with "mirror", where to write its stamps."""
    import torch.distributed as dist

    from ..api import compile as kogc_compile
    from ..frontend.model_file import build_model
    from ..runtime.kernel import fill_kv_from, kv_cache_buffers, randomize_kv

    check_timing([context], steps, reps)
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    mirror = one_gpu == "mirror"
    model = build_model(model_file, preset=preset, checkpoint=checkpoint, seed=seed, **(overrides or {}))
    options = dict(kogc_options or {})
    from ..runtime.distributed import ranks_on
    cfg = {"model_file": model_file, "preset": preset, "context": context, "steps": steps, "reps": reps, "gpus": gpus,
           "mirror": mirror,
           "ranks_on": f"rank 0 of {gpus} on one GPU, its peers mirrored" if mirror else ranks_on(gpus, one_gpu=one_gpu),
           "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__}
    rows: list[Row] = []
    readings = [read_bandwidth()]
    label = _label(gpus, mirror)

    def kogc_rows(ck):           # (its caches filled from the model's for the check before)
        launch = _launcher(ck)
        say(f"timing {label} ({steps} steps x {reps})")
        rows.append(Row(label, time_steps(lambda i: launch(1 + i % 100, context + i), steps, reps, "cuda")))
        say(f"timing {label} generating {steps} tokens in one launch")
        rows.append(Row(f"{label} generate (one launch)",
                        [ms / steps for ms in time_steps(lambda i: launch(1, context, steps), 1, reps, "cuda",
                                                         warmup=1)]))
        for k in _kernels(ck):
            k.raise_if_stuck()

    say(f"compiling {gpus} ranks" + {True: " on one GPU", "mirror": " (rank 0, its peers mirrored)"}.get(one_gpu, ""))
    ck = kogc_compile(model, gpus=gpus, one_gpu=one_gpu, **options)
    kernels = _kernels(ck)
    gen = torch.Generator().manual_seed(seed + 1)      # a random cache up to the context, for every stack
    randomize_kv(kv_cache_buffers(kernels[0].ir, model), context, gen)
    floor_bytes = sum(bytes_per_token(k, context + steps // 2) for k in kernels)
    # the TP=G stack streams the model's own weights: beside FP8 ranks, its floor is of those bytes
    tp_extra = ({"floor_bytes": sum(bytes_per_token(k, context + steps // 2, as_model=True) for k in kernels)}
                if options.get("weights", "model") != "model" else {})
    if mirror:     # the model the mirrored rank computes, for its check and, timed alike, the one-GPU kernel's
        mirror_lane_groups(model, gpus)
    for k in kernels:
        fill_kv_from(k, model)
    say(f"checking one step of {label} against eager at position {context}")
    checks = {label: check_step(ck, model, context, "cuda", mirror_of=gpus if mirror else 0)}
    kogc_rows(ck)
    say("profiling one step of the ranks")
    pk = kogc_compile(model, gpus=gpus, one_gpu=one_gpu, profile=profile, **options)
    for k in _kernels(pk):
        fill_kv_from(k, model)
    for i in range(3):
        _launcher(pk)(1, context + i)
    torch.cuda.synchronize()
    waits = remote_waits(_kernels(pk))
    if dist.is_initialized():        # every process profiled its own rank: rank 0 reports them all
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, waits["per_rank"])
        waits = {"per_rank": [w for p in parts for w in p]}
    prof = _mirror_profile(pk, model_file, preset, checkpoint, overrides, task_times, say) if mirror else None
    ck = pk = kernels = None    # (the rank kernels freed before the one-GPU kernel is built)
    torch.cuda.empty_cache()

    say("compiling the one-GPU kernel")
    single = kogc_compile(model, **options)
    fill_kv_from(single, model)
    say(f"checking one step of the one-GPU kernel against eager at position {context}")
    checks["kogc 1 GPU"] = check_step(single, model, context, "cuda")
    rows.append(Row("kogc 1 GPU", time_steps(lambda i: single.launch(1 + i % 100, context + i), steps, reps, "cuda"),
                    extra={"floor_bytes": bytes_per_token(single, context + steps // 2)}))
    single = None
    torch.cuda.empty_cache()

    if not mirror:                   # (the TP=G stack needs G GPUs: no row beside a mirror)
        rows.append(_tp_row(model, gpus, context, steps, reps, seed, say, tp_extra))
    readings.append(read_bandwidth())
    bw = max(readings)
    if prof and prof.get("task_times"):               # the file names the bandwidth of the floor
        from ..analysis.stamps import record_read_bandwidth
        record_read_bandwidth(prof["task_times"], bw)
    per = "the whole model on one GPU" if one_gpu is True else "one GPU's share"
    res = {"config": cfg, "floor": {"bytes_per_token": floor_bytes, "read_bw_Bps": bw, "read_bw_readings_Bps": readings,
                                    "ms": floor_bytes / bw * 1e3, "per": per},
           "rows": [r.to_dict(floor_bytes) for r in rows], "remote_waits": waits, "checks": checks,
           "passed": all(c["ok"] for c in checks.values()),
           "seconds": time.perf_counter() - t0}
    if prof is not None:
        res["profile"] = prof
    return res


def _label(gpus: int, mirror: bool) -> str:
    """The ranks' row name."""
    return f"kogc rank 0 of {gpus}, mirrored" if mirror else f"kogc {gpus} ranks"


def _tp_row(model, gpus: int, context: int, steps: int, reps: int, seed: int, say, extra: dict) -> Row:
    """The TP=G NCCL + CUDA-graph stack's row (an error row without an NCCL group of one GPU per rank)."""
    import torch.distributed as dist
    name = f"TP={gpus} NCCL + CUDA graph"
    if not (dist.is_initialized() and dist.get_backend() == "nccl"):
        return Row(name, [], error="needs an NCCL group with one GPU per rank")
    from .tp import tp_graph_step
    say(f"timing the TP={gpus} stack (NCCL all-reduce, one CUDA graph)")
    try:
        run, _ = tp_graph_step(model, context, "cuda", seed)
        return Row(name, time_steps(run, steps, reps, "cuda"), extra=extra)
    except Exception as e:           # reported, not fatal
        return Row(name, [], error=f"{type(e).__name__}: {str(e)[:200]}")


def _mirror_profile(pk, model_file, preset, checkpoint, overrides, task_times, say) -> dict:
    """The mirrored rank's profiled step summarised as one GPU's is (a wait on the peers' sum read as a
    wait on the rank's own send), and with `task_times` its stamps for kogc analyze."""
    from ..runtime.profile import format_summary, summarize
    prof = summarize(pk)
    prof["text"] = format_summary(prof)
    if task_times:
        from ..analysis.stamps import save_stamps
        prof["task_times"] = save_stamps(pk, task_times, model_file=model_file, preset=preset, checkpoint=checkpoint,
                                         overrides=overrides)
        say(f"wrote the profiled step's task times to {prof['task_times']}")
    return prof


def mirror_speedup(res: dict) -> str:
    """The mirrored rank against the one-GPU kernel of the same run: what G GPUs could give at most."""
    rows = {r["name"]: r for r in res["rows"] if r.get("ms_median")}
    G = res["config"]["gpus"]
    rank = rows.get(_label(G, True))
    one = rows.get("kogc 1 GPU")
    if not rank or not one:
        return "mirror: a row failed, no ratio"
    return (f"rank 0 of {G}, mirrored: {one['ms_median'] / rank['ms_median']:.2f}x the one-GPU kernel "
            f"({1e3 / rank['ms_median']:.0f} tok/s): the most {G} GPUs can give this schedule (free exchanges, "
            f"peers in step)")


def format_remote_waits(res: dict) -> str:
    lines = ["waiting on peers' flags in one profiled step (program-us summed over the tasks that wait on a peer"
             + ("; mirrored: on the rank's own sends" if res["config"].get("mirror") else "") + "):"]
    for r in res["remote_waits"]["per_rank"]:
        lines.append(f"  rank {r['rank']}: {r['tasks']} tasks, {r['program_us']:.1f} program-us, longest "
                     f"{r['longest_us']:.1f} us")
    return "\n".join(lines)

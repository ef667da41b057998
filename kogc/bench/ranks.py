"""`kogc bench --gpus G`: delayed tensor parallelism timed, with in the same run the one-GPU kogc kernel,
the Megatron-style TP=G stack (NCCL all-reduce, the whole step in one CUDA graph; across GPUs only)
and the floor per GPU; and from a profiled step, the time the ranks' programs spent waiting on their
peers' flags.

Run as G processes (one per GPU: `kogc bench --gpus G` starts them; under torchrun each process runs
this) or, with `--one-gpu`, every rank on this one GPU (a test of the protocol: the ranks share the
GPU's bandwidth, so the floor is the whole model's)."""
from __future__ import annotations

import time

import torch

from .measure import Row, bytes_per_token, read_bandwidth, time_steps


def _kernels(ck):
    """The rank kernels this process runs (all of them on one GPU, its own across GPUs)."""
    return ck.kernels if hasattr(ck, "kernels") else [ck.kernel]


def _launcher(ck):
    """launch(token, pos, nsteps) for every rank this process runs."""
    if hasattr(ck, "kernels"):
        return lambda tok, pos, n=1: ck._launch_all(tok, pos, nsteps=n)
    return lambda tok, pos, n=1: ck.kernel.launch(tok, pos, nsteps=n)


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


def run_bench_ranks(model_file: str, preset: str | None, gpus: int, one_gpu: bool, context: int = 1024,
                    steps: int = 100, reps: int = 5, seed: int = 0, checkpoint: str | None = None,
                    overrides: dict | None = None, kogc_options: dict | None = None, quiet: bool = False,
                    progress=None) -> dict:
    import torch.distributed as dist

    from ..api import compile as kogc_compile
    from ..frontend.model_file import build_model
    from ..runtime.kernel import fill_kv_from, kv_cache_buffers, randomize_kv

    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    model = build_model(model_file, preset=preset, checkpoint=checkpoint, seed=seed, **(overrides or {}))
    options = dict(kogc_options or {})
    from ..check import ranks_on
    cfg = {"model_file": model_file, "preset": preset, "context": context, "steps": steps, "reps": reps, "gpus": gpus,
           "ranks_on": ranks_on(gpus, one_gpu=one_gpu), "device": torch.cuda.get_device_name(),
           "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__}
    rows: list[Row] = []
    readings = [read_bandwidth()]

    def kogc_rows(ck, label):
        for k in _kernels(ck):
            fill_kv_from(k, model)
        launch = _launcher(ck)
        say(f"timing {label} ({steps} steps x {reps})")
        rows.append(Row(label, time_steps(lambda i: launch(1 + i % 100, context + i), steps, reps, "cuda")))
        say(f"timing {label} generating {steps} tokens in one launch")
        rows.append(Row(f"{label} generate (one launch)",
                        [ms / steps for ms in time_steps(lambda i: launch(1, context, steps), 1, reps, "cuda",
                                                         warmup=1)]))
        for k in _kernels(ck):
            k.raise_if_stuck()

    say(f"compiling {gpus} ranks" + (" on one GPU" if one_gpu else ""))
    ck = kogc_compile(model, gpus=gpus, one_gpu=one_gpu, **options)
    kernels = _kernels(ck)
    gen = torch.Generator().manual_seed(seed + 1)      # a random cache up to the context, for every stack
    randomize_kv(kv_cache_buffers(kernels[0].ir, model), context, gen)
    floor_bytes = sum(bytes_per_token(k, context + steps // 2) for k in kernels)
    kogc_rows(ck, f"kogc {gpus} ranks")
    say("profiling one step of the ranks")
    pk = kogc_compile(model, gpus=gpus, one_gpu=one_gpu, profile=True, **options)
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
    ck = pk = None
    torch.cuda.empty_cache()

    say("compiling the one-GPU kernel")
    single = kogc_compile(model, **options)
    fill_kv_from(single, model)
    rows.append(Row("kogc 1 GPU", time_steps(lambda i: single.launch(1 + i % 100, context + i), steps, reps, "cuda")))
    single = None
    torch.cuda.empty_cache()

    if dist.is_initialized() and dist.get_backend() == "nccl":
        from .tp import tp_graph_step
        say(f"timing the TP={gpus} stack (NCCL all-reduce, one CUDA graph)")
        try:
            run, _ = tp_graph_step(model.config, context, "cuda", seed)
            rows.append(Row(f"TP={gpus} NCCL + CUDA graph", time_steps(run, steps, reps, "cuda")))
        except Exception as e:       # reported, not fatal
            rows.append(Row(f"TP={gpus} NCCL + CUDA graph", [], error=f"{type(e).__name__}: {str(e)[:200]}"))
    else:
        rows.append(Row(f"TP={gpus} NCCL + CUDA graph", [], error="needs an NCCL group with one GPU per rank"))
    readings.append(read_bandwidth())
    bw = max(readings)
    res = {"config": cfg, "floor": {"bytes_per_token": floor_bytes, "read_bw_Bps": bw, "read_bw_readings_Bps": readings,
                                    "ms": floor_bytes / bw * 1e3,
                                    "per": "the whole model on one GPU" if one_gpu else "one GPU's share"},
           "rows": [r.to_dict(floor_bytes) for r in rows], "remote_waits": waits,
           "seconds": time.perf_counter() - t0}
    return res


def format_remote_waits(res: dict) -> str:
    lines = ["waiting on peers' flags in one profiled step (program-us summed over the tasks that wait on a peer):"]
    for r in res["remote_waits"]["per_rank"]:
        lines.append(f"  rank {r['rank']}: {r['tasks']} tasks, {r['program_us']:.1f} program-us, longest "
                     f"{r['longest_us']:.1f} us")
    return "\n".join(lines)

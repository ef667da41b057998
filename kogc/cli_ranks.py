"""The `kogc` command line's pieces for delayed tensor parallelism (several GPUs): `--gpus G` on compile,
run, bench and check, and `kogc predict` (the ranks' speed model)."""
from __future__ import annotations

import os
import sys
import time

from .cli_common import OUTPUT_FILES, fail, parse_ints, parse_tile_config, print_progress, save_json
from .cli_model import positive_int
from .ir.graph import Op


def bench_ranks(args, preset: str | None, context: int, overrides: dict) -> int:
    """kogc bench --gpus G: kogc on G ranks beside the one-GPU kernel and the TP=G stack, or with --mirror
    rank 0 alone with its peers mirrored beside the one-GPU kernel (kogc.bench.ranks)."""
    if args.interpret:
        return fail("--gpus times the ranks on GPUs: not with --interpret")
    if not args.mirror and (args.profile or args.task_times):
        return fail("--profile and --task-times apply to one kernel: with --gpus only with --mirror (the ranks' "
                    "remote waits are profiled anyway)")
    if args.task_times and not args.profile:
        return fail("--task-times writes the stamps of a profiled step: it needs --profile")
    started = start_ranks(args)
    if started is not None:
        return started
    from .bench import format_table, progress as bench_progress, write_json
    from .bench.ranks import format_remote_waits, mirror_speedup, run_bench_ranks
    res = run_bench_ranks(args.model_file, preset, args.gpus, "mirror" if args.mirror else args.one_gpu,
                          context=context, steps=args.steps, reps=args.reps, checkpoint=args.checkpoint,
                          overrides=overrides, kogc_options={"tile_config": parse_tile_config(args.tile_config),
                                                                         "weights": args.weights},
                          progress=lambda m: bench_progress(m, quiet=False),
                          profile=args.profile or True, task_times=args.task_times)
    print(format_table(res))
    print(f"(floor: {res['floor']['per']})")
    if args.mirror:
        print(mirror_speedup(res))
    print(format_remote_waits(res))
    if args.json:
        write_json(res, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if res["passed"] else 1


def gpus_args(p) -> None:
    p.add_argument("--gpus", type=positive_int, default=1, metavar="G",
                   help="delayed tensor parallelism: the model's lanes over G ranks, one kernel each (default 1)")
    p.add_argument("--one-gpu", action="store_true",
                   help="with --gpus G: run all G ranks on this one GPU, each with its share of the programs "
                        "(tests the protocol; not faster)")

def start_ranks(args):
    """--gpus G outside torchrun (and without --one-gpu or --interpret): check the model and the GPUs
    here, then start G processes running this same command through torch.distributed's launcher and
    return 0; None where this process runs the command itself (a rank, one GPU, the interpreter)."""
    from .runtime import distributed
    if distributed.launched():
        if distributed.rank() != 0:      # one rank prints and writes the command's files (the ranks' results
            sys.stdout = open(os.devnull, "w")   # are the same; G writers of one file could interleave)
            for name in OUTPUT_FILES:
                if hasattr(args, name):
                    setattr(args, name, None)
        return None
    if args.one_gpu or getattr(args, "mirror", False) or getattr(args, "interpret", False):
        return None
    from .frontend import to_ir
    from .frontend.model_file import build_for_tracing
    from .ir.shard import check_shardable
    model = build_for_tracing(args.model_file, preset=None if args.checkpoint else args.config,
                              checkpoint=args.checkpoint, **({"num_lanes": args.lanes} if args.lanes else {}))
    check_shardable(to_ir(model, gpus=args.gpus), args.gpus)
    distributed.check_gpus(args.gpus)
    return distributed.relaunch(args.gpus, args.argv)


def _bodies_from(path: str) -> tuple[dict, bool]:
    """Per kind, the median body of the profiled step in a task-times file; and whether the profile is a
    detail one (kogc bench --profile detail), as the model's own bodies are."""
    import numpy as np
    from .analysis.stamps import bodies_of_file, load_stamps
    bodies = {k: float(np.median(v)) for k, v in bodies_of_file(path).items()}
    return bodies, load_stamps(path)[1].shape[1] >= 5


# why a plain profile's bodies read optimistic (docs/multi-gpu.md, The speed model)
PLAIN_BODIES = ("note: bodies of a plain profile; the model was fitted with a detail profile's (kogc bench --profile "
                "detail), whose longer bodies stand in for the late waits it lacks: with a plain profile's it reads "
                "optimistic (laneformer-2b at 8 GPUs: -16%)")

# why FP8 weights want their own bodies (docs/fp8.md, where the FP8 step's time goes)
FP8_FP16_BODIES = ("note: the model's bodies are fp16 weights'; FP8 tiles hold twice the weights and their products "
                   "take longer: give an FP8 profile's with --bodies (laneformer-2b at one GPU: 0.779 ms with the "
                   "fp16 bodies, 0.963 with those of docs/results/2026-12-04/task-times-2b-fp8-detail-feacb90.npz, "
                   "0.950 measured)")


# where no bodies were measured at a model's widths (kogc.analysis.body_tables): laneformer-2b's serve
OTHER_WIDTHS_BODIES = ("note: no bodies were measured at this model's widths (hidden size {}, head_dim {}): the "
                       "model takes laneformer-2b's (2048 and 128), whose prologues and attention are not this "
                       "model's; rank 0 of 8 mirrored on an H100 read +24% for laneformer-0.5b and -9% for 7b with "
                       "them, +10% and -2% with their own: give this model's with --bodies (kogc bench --profile "
                       "detail --task-times FILE)")


def body_widths(graph) -> tuple[int | None, int | None]:
    """The hidden size (the embedding's width) and attention's head_dim; None where the graph has neither."""
    by = graph.by_name()
    hidden = next((n.type.shape[-1] for n in graph.nodes if n.op is Op.EMBED), None)
    head_dim = max((by[n.inputs[1]].type.shape[2] for n in graph.nodes if n.op is Op.ATTENTION), default=None)
    return hidden, head_dim


def cache_positions(graph) -> int | None:
    """The KV cache's positions (an attention's cache, [kv heads, positions, head size]); None without one."""
    by = graph.by_name()
    return max((by[n.inputs[1]].type.shape[1] for n in graph.nodes if n.op is Op.ATTENTION), default=None)


def cmd_predict(args) -> int:
    from .analysis.body_tables import bodies_of, body_table_for
    from .analysis.ranks import DEFAULT_CONTEXT, predict
    from .analysis.stream import StreamParams
    from .frontend import to_ir
    from .frontend.model_file import build_for_tracing
    from .settings import tile_config_for
    from .targets import get_target
    try:
        target = get_target(args.target)
    except KeyError as e:
        return fail(e.args[0])
    gpus = parse_ints(args.gpus, "--gpus")
    if min(gpus) < 1:
        return fail(f"--gpus takes rank counts >= 1, got {args.gpus}")
    t0 = time.perf_counter()
    model = build_for_tracing(args.model_file, preset=None if args.checkpoint else args.config,
                              checkpoint=args.checkpoint, **({"num_lanes": args.lanes} if args.lanes else {}))
    graph = to_ir(model)
    positions = cache_positions(graph)
    if positions and args.context and args.context > positions:
        return fail(f"--context {args.context} does not fit the KV cache of {positions} positions")
    context = args.context or min(DEFAULT_CONTEXT, positions or DEFAULT_CONTEXT)
    given = parse_tile_config(args.tile_config)
    widths = body_widths(graph)
    table = body_table_for(widths)
    params = StreamParams(hop_us=args.local_us, body_us=bodies_of(table))
    detail = True
    if args.bodies:
        bodies, detail = _bodies_from(args.bodies)
        params.body_us.update(bodies)
    rows = predict(graph, target, lambda G: tile_config_for(model, target, given, weights=args.weights, gpus=G), gpus,
                   params, args.remote_us, args.measured_ms,
                   progress=lambda G: print_progress(gpus.index(G) + 1, len(gpus), f"replaying {G} rank(s)", t0),
                   context=context)
    print(f"{args.checkpoint or args.config} on {target.name} at context {context}: hop {args.local_us:g} us "
          f"within a GPU, "
          f"{args.remote_us:g} us across; bodies {args.bodies or f'of {table.model} ({table.source})'} (a model)")
    for r in rows:
        extra = (f"; calibrated by the measured one-GPU step (x{r['calibration']:.3f}): {r['predicted_ms']:.3f} ms, "
                 f"{r['predicted_tok_s']:.0f} tok/s") if "predicted_ms" in r else ""
        print(f"  {r['gpus']} GPU(s): {r['model_ms']:.3f} ms, {r['model_tok_s']:.0f} tok/s{extra}")
    if not detail:
        print(PLAIN_BODIES)
    if args.weights == "fp8" and not args.bodies:
        print(FP8_FP16_BODIES)
    if table.widths != widths and not args.bodies:
        print(OTHER_WIDTHS_BODIES.format(*widths))
    if args.json:
        save_json({"config": args.config, "target": target.name, "context": context, "local_us": args.local_us,
                   "remote_us": args.remote_us, "bodies": args.bodies or table.model, "bodies_detail": detail,
                   "measured_one_gpu_ms": args.measured_ms,
                   "rows": rows}, args.json)
    return 0

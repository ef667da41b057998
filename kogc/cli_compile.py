"""`kogc compile`: trace, lower and schedule a model, then print a stage (--emit) or write the build
folder (--out: IR, schedule, report, kernel source and its ahead-of-time binary; --per-variant each code
variant alone)."""
from __future__ import annotations

import os
import time

from .cli_common import fail, parse_tile_config, print_progress, print_stage_time
from .cli_model import model_overrides
from .errors import KogcError


def cmd_compile(args) -> int:
    from .scheduler.schedule import without_cycle_collection
    # the schedule's millions of small objects live to the end of the command: with the cycle collector on,
    # writing and compiling after the build walked them again at every full collection (laneformer-7b:
    # 4.3 of 37 s; no cycles among them, and the command's peak memory the same without it)
    with without_cycle_collection():
        return _compile(args)


def _compile(args) -> int:
    from .frontend import to_ir
    from .frontend.model_file import build_for_tracing
    from .ir import to_json, to_text
    from .settings import default_target
    from .targets import get_target

    try:
        target = get_target(args.target or default_target())
    except KeyError as e:
        return fail(e.args[0])
    if not args.emit and not args.out:
        return fail("nothing to do: give --emit STAGE or --out DIR")
    if args.per_variant and not args.out:
        return fail("--per-variant writes its binaries and table under --out DIR: give one")
    if args.gpus != 1 and args.per_variant:
        return fail("--per-variant with --gpus: compile one rank's variants with --gpus 1 instead")
    tile_config = parse_tile_config(args.tile_config)       # (a malformed one is refused before the trace)
    t0 = time.perf_counter()
    total = 2 if args.emit in ("ir", "ir-json") else (5 + args.per_variant if args.out else 3)
    overrides = model_overrides(args)
    model = build_for_tracing(args.model_file, preset=args.config, checkpoint=args.checkpoint, **overrides)
    graph = to_ir(model, gpus=args.gpus)
    graph.meta["target"] = target.name
    print_progress(1, total, f"traced {args.model_file}", t0)
    if args.emit in ("ir", "ir-json"):
        print_progress(2, total, f"lowered to IR: {len(graph.nodes)} nodes", t0)
        print(to_json(graph) if args.emit == "ir-json" else to_text(graph, sources=True))
        return 0
    from .codegen.render import render
    from .scheduler import SchedulerError, build_schedule
    from .settings import tile_config_for
    print_progress(2, total, f"IR has {len(graph.nodes)} nodes; scheduling for {target.name}", t0)
    cfg = tile_config_for(model, target, tile_config, weights=args.weights, gpus=args.gpus)
    if args.gpus != 1:
        return compile_ranks(args, graph, target, cfg, t0, total)
    try:
        # placed as kogc.compile places it (with the model's shipped task times, if any)
        schedule = build_schedule(graph, target, tile_config=cfg, progress=print_stage_time)
    except SchedulerError as e:
        return fail(str(e))
    print_progress(3, total, f"{len(schedule.tasks)} tasks on {len(schedule.queues)} programs; generating code", t0)
    source = render(schedule)
    print_stage(args.emit, schedule, source)
    if args.out:
        write_outputs(args.out, graph, schedule, source, target, t0, total)
    if args.per_variant:
        write_variant_table(args.out, schedule, t0, total)
    return 0




def write_variant_table(out: str, schedule, t0: float, total: int) -> None:
    from .codegen.variants import format_variant_table, variant_summaries

    def progress(i, n, v):
        print_progress(total, total, f"compiling code variant {i + 1}/{n} alone: {'/'.join(map(str, v))}", t0)
    try:
        rows = variant_summaries(schedule, os.path.join(out, "variants"), progress)
    except (RuntimeError, ValueError) as e:
        raise KogcError(f"ahead-of-time compilation of a variant failed: {e}") from None
    table = format_variant_table(rows)
    with open(os.path.join(out, "variants.txt"), "w") as f:
        f.write(table + "\n")
    print(table)


def print_stage(emit: str | None, schedule, source: str) -> None:
    """--emit tasks | schedule | source of a schedule (rank 0's with --gpus); others print nothing here."""
    if emit == "tasks":
        print(format_tasks(schedule))
    elif emit == "schedule":
        print(schedule.report())
        print(format_queues(schedule))
    elif emit == "source":
        print(source, end="")


def format_tasks(schedule) -> str:
    lines = ["# id variant op lane layer | waits (event:need) -> publishes | weight tile"]
    for t in schedule.tasks:
        w = t.weight.where if t.weight else "-"
        waits = " ".join(f"{g}:{n}" for g, n in t.waits) or "-"
        lines.append(f"{t.id} {'/'.join(map(str, t.variant))} {t.op} {t.lane} {t.layer} | {waits} -> {t.group} | {w}")
    return "\n".join(lines)


def format_queues(schedule) -> str:
    per = schedule.weight_elems_per_program()
    lines = ["# program: tasks, weight stream elements, first..last task"]
    for p, q in enumerate(schedule.queues):
        lines.append(f"{p}: {len(q)} tasks, {per[p]} weights, {q[0] if q else '-'}..{q[-1] if q else '-'}")
    return "\n".join(lines)


def write_outputs(out: str, graph, schedule, source: str, target, t0: float, total: int) -> None:
    from .codegen.aot import compile_kernel
    from .codegen.render import KERNEL_NAME, signature
    from .ir import to_text
    os.makedirs(out, exist_ok=True)
    files = {"ir.txt": to_text(graph, sources=True), "schedule.json": schedule.to_json(),
             "report.txt": schedule.report() + "\n", "kernel.py": source}
    for name, text in files.items():
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    print_progress(4, total, f"wrote {', '.join(files)}; compiling for {target.arch} with triton.compile", t0)
    sig, consts = signature(schedule)
    try:
        arts = compile_kernel(os.path.join(out, "kernel.py"), KERNEL_NAME, sig, consts, target.name,
                              os.path.join(out, target.arch), num_warps=target.num_warps,
                              options={"maxnreg": target.max_registers} if target.max_registers else None)
    except (RuntimeError, ValueError) as e:
        raise KogcError(f"ahead-of-time compilation failed: {e}") from None
    from .codegen.aot import disassembly_summary
    summary = disassembly_summary(arts)
    with open(os.path.join(out, "report.txt"), "a") as f:
        f.write("machine code: " + ", ".join(f"{k} {v}" for k, v in summary.items()) + "\n")
        if target.vendor == "amd":     # the synchronisation, checked in the ISA (kogc.codegen.amd_isa)
            from .codegen.amd_isa import check
            with open(arts["amdgcn"]) as a, open(arts["ttir"]) as t:
                sync = check(a.read(), t.read(), source)
            f.write(f"synchronisation (gfx942 ISA): {sync['publishes']} counter publishes, {sync['acquires']} "
                    f"acquires, {len(sync['problems'])} problems\n" + "".join(f"  {p}\n" for p in sync["problems"]))
            if sync["problems"]:
                raise KogcError(f"the {target.arch} build's synchronisation is wrong: {sync['problems'][0]} (see "
                                f"{os.path.join(out, 'report.txt')})")
    binary = arts.get("cubin") or arts.get("hsaco")
    print_progress(5, total, f"done: {binary}", t0)


def compile_ranks(args, graph, target, cfg, t0: float, total: int) -> int:
    """kogc compile --gpus G: every rank's schedule (each rank a whole GPU), proven sound together, and
    with --out one kernel per rank in OUT/rank<r>."""
    from .codegen.render import render
    from .ir.shard import check_shardable
    from .scheduler.ranks import build_rank_schedules
    check_shardable(graph, args.gpus)
    schedules = build_rank_schedules(graph, args.gpus, target, tile_config=cfg, progress=print_stage_time)
    s0 = schedules[0]
    print_progress(3, total, f"{args.gpus} ranks, {len(s0.tasks)} tasks on {len(s0.queues)} programs each; "
                             f"generating code", t0)
    sources = [render(s) for s in schedules]
    print_stage(args.emit, s0, sources[0])
    if args.out:
        for s, src in zip(schedules, sources):
            write_outputs(os.path.join(args.out, f"rank{s.rank}"), s.graph, s, src, target, t0, total)
    return 0

"""The text views of `kogc inspect`: the summary of a schedule, one task decoded, one program's queue,
one layer's groups."""
from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from ..errors import KogcError
from ..runtime.profile import kind_key
from . import costs
from .costs import ranges, short_kind


def _stats(a) -> str:
    a = np.asarray(a, dtype=float)
    return f"{a.min():.4g} / {a.mean():.4g} / {a.max():.4g}" if len(a) else "-"


def _mb(x) -> float:
    return x / 1e6


def header(ins) -> str:
    s = ins.schedule
    t = s.target
    return (f"{ins.where}: target {t.name} ({t.arch}), placement {s.placement}, {len(s.queues)} programs, "
            f"{len(s.tasks)} tasks, {len(s.variants)} code variants, {len(s.events)} events, "
            f"{len(ins.layers())} layers")


def kind_table(ins, us: list[float]) -> list[str]:
    s = ins.schedule
    rows: dict[str, list] = {}
    for t in s.tasks:
        r = rows.setdefault(kind_key(t), [0, 0, 0, 0.0, 0])
        r[0] += 1
        r[1] += costs.weight_bytes(ins, t)
        r[2] += t.cost_bytes
        r[3] += us[t.id]
        r[4] += len(t.waits)
    lines = [f"{'kind':30} {'tasks':>7} {'weight MB':>10} {'bytes MB':>9} {'us each':>8} {'us total':>9} {'waits':>6}"]
    for k, (n, wb, b, u, w) in sorted(rows.items(), key=lambda kv: -kv[1][3]):
        lines.append(f"{k:30} {n:7d} {_mb(wb):10.3f} {_mb(b):9.3f} {u / n:8.2f} {u:9.1f} {w:6d}")
    tot = [sum(r[i] for r in rows.values()) for i in range(5)]
    lines.append(f"{'all':30} {tot[0]:7d} {_mb(tot[1]):10.3f} {_mb(tot[2]):9.3f} {'':>8} {tot[3]:9.1f} {tot[4]:6d}")
    return lines


def machine_lines(ins) -> list[str]:
    lines = []
    m = ins.machine
    if m:
        if m.get("backend") == "hip":
            parts = [f"VGPRs {m.get('vgprs', '-')}", f"SGPRs {m.get('sgprs', '-')}",
                     f"scratch {m.get('scratch_bytes', '-')} B", f"VGPR spills {m.get('vgpr_spills', '-')}",
                     f"dwordx4 loads {m.get('global_load_dwordx4', '-')} of {m.get('global_load', '-')}"]
        else:
            parts = [f"registers {m.get('registers', '-')}",
                     f"spills {m.get('spill_store_bytes', '-')} B stored / {m.get('spill_load_bytes', '-')} B loaded",
                     f"local {m.get('local_bytes', '-')} B", f"shared {m.get('shared_bytes', '-')} B",
                     f"128-bit loads {m.get('ld_global_128', '-')} of {m.get('ld_global', '-')}",
                     f"barriers {m.get('bar_sync', '-')}"]
        lines.append("machine code (the whole kernel): " + ", ".join(parts))
    if ins.metadata:
        md = ins.metadata
        lines.append(f"Triton metadata: {md.get('name', '?')}, num_warps {md.get('num_warps', '-')}, maxnreg "
                     f"{md.get('maxnreg', '-')}, shared {md.get('shared', '-')} B, arch {md.get('arch', '-')}")
    if ins.variant_rows:
        used = Counter(ins.schedule.variants.index(t.variant) for t in ins.schedule.tasks)
        lines.append("code variants (variants.txt: each body compiled alone):")
        lines.append(f"  {'id':>3} {'registers':>9} {'spills B':>9} {'tasks':>7}  variant")
        for r in ins.variant_rows:
            lines.append(f"  {r['id']:3d} {r['registers'] if r['registers'] is not None else '-':>9} "
                         f"{r['spill_store_bytes'] if r['spill_store_bytes'] is not None else '-':>9} "
                         f"{used.get(r['id'], 0):7d}  {r['variant']}")
    elif ins.is_build:
        lines.append("code variants: no variants.txt (kogc compile ... --out DIR --per-variant writes registers and "
                     "spills per variant)")
    return lines


def summary(ins) -> str:
    s = ins.schedule
    us = costs.task_us(ins)
    pp = costs.per_program(ins, us)
    step, ends = costs.as_scheduled(ins, us)
    whole = costs.chain(ins, us)
    prog_end = np.array([max((ends[t] for t in q), default=0.0) for q in s.queues])
    lines = [header(ins), ""]
    lines += ["tasks per kind (us: the cost model's):"] + kind_table(ins, us) + [""]
    lines.append("per program                     min / mean / max")
    lines.append(f"  tasks                         {_stats(pp['tasks'])}")
    lines.append(f"  weight MB                     {_stats(pp['weight_bytes'] / 1e6)}")
    lines.append(f"  bytes MB (cost model)         {_stats(pp['bytes'] / 1e6)}")
    lines.append(f"  predicted busy us             {_stats(pp['busy_us'])}")
    lines.append(f"  predicted end us (scheduled)  {_stats(prog_end)}")
    lines.append(f"  busiest program {int(np.argmax(pp['busy_us']))}, last to end {int(np.argmax(prog_end))}")
    lines.append("")
    lines.append("cost model: " + costs.cost_model_name(ins) + f"; {ins.latency_us:g} us per hop")
    est = ""
    if ins.est_us is not None:
        est = (f" (the placement's estimate: {ins.est_us:.0f} us, report.txt)" if ins.est_resolution_us
               else f" (the placement's estimate: {ins.est_us:.1f} us)")
    lines.append(f"  step as scheduled {step:.1f} us{est}; the chain through the waits {whole['us']:.1f} us "
                 f"({whole['hops']} hops); perfect balance {sum(us) / len(s.queues):.1f} us")
    if ins.est_us is not None and abs(step - ins.est_us) > max(0.01 * ins.est_us, ins.est_resolution_us + 0.05):
        lines.append(f"  note: the placement estimated {ins.est_us:.0f} us with other task times: "
                     + ("schedule.json does not record them (TileConfig.kind_us, e.g. the model's shipped profile "
                        "examples/profiles/<preset>.<target>.json); give them with --kind-us"
                        if not ins.kind_us_known else "the cost model differs from the placement's"))
    lines.append("  the step's chain (us): " + costs.composition_text(ins, whole["path"], us))
    lines.append("")
    rows = costs.layer_chains(ins, us)
    if rows:
        lines.append("per layer (us): alone: the longest path through the waits among the layer's own tasks; in the "
                     "step's chain: the part of the step's chain in the layer (with the unlayered tasks, e.g. "
                     "residuals, it leads through, and its hops); chain end / scheduled end: when the step's chain / "
                     "the scheduled step reach the layer's last task")
        lines.append(f"{'layer':>5} {'tasks':>6} {'weight MB':>9} {'alone':>7} {'in chain':>8} {'chain end':>9} "
                     f"{'sched end':>9}  the step's chain in the layer")
        for r in rows:
            alone = f"{r['alone_us']:7.1f}" if r["alone_us"] is not None else f"{'-':>7}"
            lines.append(f"{'tail' if r['layer'] is None else r['layer']:>5} {r['tasks']:6d} "
                         f"{_mb(r['weight_bytes']):9.2f} {alone} {r['segment_us']:8.1f} {r['step_chain_end_us']:9.1f} "
                         f"{r['scheduled_end_us']:9.1f}  {costs.path_text(ins, r['segment'], us)}")
        lines.append("")
    lines += machine_lines(ins)
    return "\n".join(lines).rstrip()


def check_index(what: str, value: int, n: int, where: str, unit: str) -> None:
    if not 0 <= value < n:
        raise KogcError(f"{what} {value} is out of range: {where} has {unit} 0..{n - 1}")


def weight_text(t, esize: int) -> str:
    w = t.weight
    if w is None:
        return "-"
    if w.scaled:
        return f"{w.where} of {w.cols} columns = {w.numel} FP8 elements and {w.rows} fp32 scales, {w.nbytes} bytes"
    return f"{w.where} of {w.cols} columns = {w.numel} elements, {w.numel * esize} bytes"


def _task_brief(s, tid: int) -> str:
    t = s.tasks[tid]
    return f"{short_kind(kind_key(t))} {t.op} lane {t.lane} layer {'-' if t.layer is None else t.layer}"


def _grouped(s, ids: list[int], limit: int = 8) -> list[str]:
    """Task ids grouped by (op, lane): '  %20.attn lane 0 layer 0 (attention): 32 tasks 10-41'."""
    g: dict = defaultdict(list)
    for tid in ids:
        t = s.tasks[tid]
        g[(t.op, t.lane, t.layer, kind_key(t))].append(tid)
    out = []
    for (op, lane, layer, k), tids in list(g.items())[:limit]:
        out.append(f"    {op} lane {lane} layer {'-' if layer is None else layer} ({short_kind(k)}): "
                   f"{len(tids)} task{'s' * (len(tids) > 1)}: {ranges(tids)}")
    if len(g) > limit:
        out.append(f"    ... and {len(g) - limit} more groups ({sum(len(v) for v in list(g.values())[limit:])} tasks)")
    return out


def describe_node(ins, name: str) -> list[str]:
    n = ins.nodes.get(name)
    if n is None:
        return [f"  op {name} (not in the IR text: no ir.txt)"]
    return [f"  op {n.text}", f"  scope {n.scope}", f"  source {n.source or '-'}"]


def decode_task(ins, tid: int, prof=None) -> str:
    s = ins.schedule
    check_index("--task", tid, len(s.tasks), ins.where, "tasks")
    t = s.tasks[tid]
    prog = costs.program_of(s)[tid]
    slot = s.queues[prog].index(tid)
    us = costs.task_us(ins)
    vid = s.variants.index(t.variant)
    lines = [f"task {tid}: {kind_key(t)}, lane {t.lane}, layer {'-' if t.layer is None else t.layer}, "
             f"program {prog} (slot {slot} of {len(s.queues[prog])})",
             f"  variant {vid}: {'/'.join(map(str, t.variant))}"]
    lines += describe_node(ins, t.op)
    lines.append(f"  weight tile {weight_text(t, ins.esize)}")
    lines.append(f"  cost model {t.cost_bytes} bytes, {us[tid]:.2f} us")
    lines.append(f"  args {t.args}")
    if prof is not None:
        j = prof.row[tid]
        a, b, c = (prof.ts[j, :3] / 1e3).tolist()
        lines.append(f"  measured: start {a:.2f} us, waits done {b:.2f} us (waited {b - a:.2f}), end {c:.2f} us "
                     f"(body {c - b:.2f})")
    if t.waits:
        lines.append(f"  waits ({len(t.waits)}):")
        for g, need in t.waits:
            e = s.events[g]
            lines.append(f"    event {g} {e.name}: needs {need} (of {e.need} per step) from")
            lines += ["  " + x for x in _grouped(s, e.tasks)]
    else:
        lines.append("  waits: none (nothing to wait for, or its program already knows it satisfied)")
    for g in t.published:               # its own event, and its op's event over all lanes if it has one
        e = s.events[g]
        waiters = costs.feeds(s).get(g, [])
        lines.append(f"  publishes event {g} {e.name} ({e.need} task{'s' * (e.need > 1)}: {ranges(e.tasks)})")
        if waiters:
            lines.append(f"  feeds {len(waiters)} task{'s' * (len(waiters) > 1)} (those waiting on event {g}):")
            lines += _grouped(s, waiters)
        else:
            lines.append(f"  feeds: no task waits on event {g}"
                         + (" (the step's token: programs wait on it between steps)"
                            if t.kind == "argmax" else " (not published)"))
    return "\n".join(lines)


def program_queue(ins, p: int, prof=None) -> str:
    s = ins.schedule
    check_index("--program", p, len(s.queues), ins.where, "programs")
    q = s.queues[p]
    us = costs.task_us(ins)
    _, ends = costs.as_scheduled(ins, us)
    wmb = sum(costs.weight_bytes(ins, s.tasks[t]) for t in q) / 1e6
    head = (f"program {p}: {len(q)} task{'s' * (len(q) != 1)}, {wmb:.3f} MB of "
            f"weights, {sum(us[t] for t in q):.1f} us busy in the cost model")
    if prof is not None and q:
        rows = prof.ts[[prof.row[t] for t in q]] / 1e3
        head += (f"; measured {rows[-1, 2] - rows[0, 0]:.1f} us from its first start to its last end, "
                 f"{(rows[:, 1] - rows[:, 0]).sum():.1f} waiting, {(rows[:, 2] - rows[:, 1]).sum():.1f} in bodies")
    cols = f"{'slot':>4} {'task':>7} {'kind':26} {'op':14} {'lane':>4} {'layer':>5} {'bytes':>7} {'us':>6} {'end':>7}"
    if prof is not None:
        cols += f" {'start':>8} {'wait':>6} {'body':>6}"
    lines = [head, cols + "  waits (event:need)"]
    for i, tid in enumerate(q):
        t = s.tasks[tid]
        line = (f"{i:4d} {tid:7d} {short_kind(kind_key(t)):26} {t.op:14} {t.lane:4d} "
                f"{'-' if t.layer is None else t.layer:>5} {t.cost_bytes:7d} {us[tid]:6.2f} {ends[tid]:7.1f}")
        if prof is not None:
            a, b, c = (prof.ts[prof.row[tid], :3] / 1e3).tolist()
            line += f" {a:8.2f} {b - a:6.2f} {c - b:6.2f}"
        lines.append(line + "  " + (" ".join(f"{g}:{n}" for g, n in t.waits) or "-"))
    return "\n".join(lines)


def check_layer(ins, layer: int) -> None:
    layers = ins.layers()
    if layer not in layers:
        raise KogcError(f"--layer {layer} is out of range: {ins.where} has layers "
                        f"{(str(layers[0]) + '..' + str(layers[-1])) if layers else '(none)'}")


def layer_groups(ins, layer: int) -> str:
    check_layer(ins, layer)
    s = ins.schedule
    us = costs.task_us(ins)
    groups = costs.groups_of_layer(ins, layer)
    c = costs.chain(ins, us, {t for ids in groups.values() for t in ids})
    on_chain = set(c["path"])
    lines = [f"layer {layer}: {sum(len(v) for v in groups.values())} tasks in {len(groups)} groups (fused op, lane); "
             f"its chain {c['us']:.1f} us: {costs.path_text(ins, c['path'], us)}",
             f"{'op':16} {'lane':>4} {'kind':26} {'tasks':>6} {'weight MB':>9} {'us each':>8}  chain  "
             "waits on (events)"]
    for (op, lane), ids in groups.items():
        t = s.tasks[ids[0]]
        evs = sorted({g for tid in ids for g, _ in s.tasks[tid].waits})
        lines.append(f"{op:16} {lane:4d} {short_kind(kind_key(t)):26} {len(ids):6d} "
                     f"{sum(costs.weight_bytes(ins, s.tasks[x]) for x in ids) / 1e6:9.3f} "
                     f"{sum(us[x] for x in ids) / len(ids):8.2f}  {'  *  ' if on_chain & set(ids) else '     '}  "
                     f"{', '.join(str(g) for g in evs) or '-'}")
    return "\n".join(lines)

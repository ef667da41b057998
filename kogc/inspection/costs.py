"""What the cost model says about a schedule: each task's time, bytes and predicted time per program,
the step as scheduled, and the dependency chain through the waits (the whole step's and each layer's).

Task times are the placement's: `kogc.scheduler.schedule.kind_seconds` (a kind's measured microseconds
where the cost model has them, else `kogc.scheduler.place.bytes_model_seconds`: the task's bytes at a
program's share of the target's read bandwidth plus a fixed overhead). "As scheduled" is
`kogc.analysis.replay.longest_path` with the queues: what the placement estimated (report.txt's "cost
model" line when the same task times are used).

The chain through the waits: a task starts a hop latency after the last producer of every event it
waits on has ended; the longest such path, queues ignored. The waits are the kernel's, after the
placement dropped those its program already knows satisfied (docs/schedule.md); for the example's
schedules this chain equals the one over the exact producers (`longest_path(..., queues=False)`), but in
general it can only be shorter.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..runtime.profile import kind_key
from ..scheduler.check import run_order
from ..scheduler.schedule import kind_seconds


def task_us(ins) -> list[float]:
    """Each task's time in the cost model (us), by task id."""
    if "task_us" not in ins.cache:
        s = ins.schedule
        bw = s.target.hbm_read_bw / len(s.queues)
        ins.cache["task_us"] = [x * 1e6 for x in kind_seconds(s.tasks, ins.kind_us, bw)]
    return ins.cache["task_us"]


def weight_bytes(ins, t) -> int:
    if t.weight is None:
        return 0
    return t.weight.nbytes if t.weight.scaled else t.weight.numel * ins.esize   # (FP8: with its scales)


def cost_model_name(ins) -> str:
    s = ins.schedule
    bw = s.target.hbm_read_bw / len(s.queues)
    kinds = sorted({kind_key(t) for t in s.tasks})
    measured = [k for k in kinds if k in ins.kind_us]
    bytes_model = (f"bytes at {s.target.hbm_read_bw / 1e12:.2f} TB/s / {len(s.queues)} programs = "
                   f"{bw / 1e9:.2f} GB/s per program + 0.5 us per task")
    if not measured:
        return "the bytes model: " + bytes_model
    rest = len(kinds) - len(measured)
    return (f"measured times of {len(measured)} kinds (TileConfig.kind_us)"
            + (f", the bytes model for {rest} ({bytes_model})" if rest else ""))


def per_program(ins, us: list[float]) -> dict:
    """Per program: tasks, weight bytes, cost-model bytes, predicted busy time (us) as numpy arrays."""
    s = ins.schedule
    tasks = s.tasks
    return {"tasks": np.array([len(q) for q in s.queues]),
            "weight_bytes": np.array([sum(weight_bytes(ins, tasks[t]) for t in q) for q in s.queues]),
            "bytes": np.array([sum(tasks[t].cost_bytes for t in q) for q in s.queues]),
            "busy_us": np.array([sum(us[t] for t in q) for q in s.queues])}


def as_scheduled(ins, us: list[float]) -> tuple[float, list[float]]:
    """The step as scheduled (us) and each task's end in it: each queue in order, a task starting when
    its program is free and every event it waits on is complete plus the hop latency (the replay of
    kogc.analysis.replay.longest_path, keeping the ends)."""
    key = ("as_scheduled", id(us))
    if key not in ins.cache:
        ins.cache[key] = _as_scheduled(ins, us)
    return ins.cache[key]


def _as_scheduled(ins, us: list[float]) -> tuple[float, list[float]]:
    s = ins.schedule
    tasks, lat = s.tasks, ins.latency_us
    end = [0.0] * len(tasks)
    done = [0.0] * len(s.events)
    last: dict[int, float] = {}
    prog = program_of(s)
    for tid in topo_order(ins):
        t = tasks[tid]
        start = max([last.get(prog[tid], 0.0)] + [done[g] + lat for g, _ in t.waits])
        end[tid] = last[prog[tid]] = start + us[tid]
        for g in t.published:                             # (a shared lane event too)
            done[g] = max(done[g], end[tid])
    return max(end, default=0.0), end


def program_of(s) -> list[int]:
    prog = [0] * len(s.tasks)
    for p, q in enumerate(s.queues):
        for tid in q:
            prog[tid] = p
    return prog


def topo_order(ins) -> list[int]:
    """Task ids with every event's producers before its waiters: the queues' run order
    (kogc.scheduler.check.run_order), computed once."""
    if "order" not in ins.cache:
        s = ins.schedule
        ins.cache["order"] = run_order(s.tasks, s.events, s.queues)
    return ins.cache["order"]


def chain(ins, us: list[float], tasks: set[int] | None = None, order: list[int] | None = None) -> dict:
    """The longest path through the waits (us), over all tasks or only `tasks` (then waits on events
    with producers outside count from 0): its length, its tasks in order, each task's end, the hops."""
    if tasks is None:
        key = ("chain", id(us))
        if key not in ins.cache:
            ins.cache[key] = _chain(ins, us, None, topo_order(ins))
        return ins.cache[key]
    return _chain(ins, us, tasks, order if order is not None else topo_order(ins))


def _chain(ins, us: list[float], tasks: set[int] | None, order: list[int]) -> dict:
    s = ins.schedule
    lat = ins.latency_us
    if tasks is not None:
        order = [t for t in order if t in tasks]
    end: dict[int, float] = {}
    parent: dict[int, int] = {}
    ev_end: dict[int, tuple[float, int]] = {}       # event -> (latest end, that task), within `tasks`
    for tid in order:
        t = s.tasks[tid]
        start, par = 0.0, -1
        for g, _ in t.waits:
            if g in ev_end and ev_end[g][0] + lat > start:
                start, par = ev_end[g][0] + lat, ev_end[g][1]
        end[tid] = start + us[tid]
        parent[tid] = par
        for g in t.published:
            if g not in ev_end or end[tid] > ev_end[g][0]:
                ev_end[g] = (end[tid], tid)
    if not end:
        return {"us": 0.0, "path": [], "end": end, "hops": 0}
    tid = max(end, key=end.__getitem__)
    length = end[tid]
    path = []
    while tid >= 0:
        path.append(tid)
        tid = parent[tid]
    path.reverse()
    return {"us": length, "path": path, "end": end, "hops": len(path) - 1}


def path_text(ins, path: list[int], us: list[float]) -> str:
    """A chain as `kind us > kind us > ...`, runs of one kind merged (`kind xN us`)."""
    runs: list[list] = []
    for tid in path:
        k = short_kind(kind_key(ins.schedule.tasks[tid]))
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
            runs[-1][2] += us[tid]
        else:
            runs.append([k, 1, us[tid]])
    return " > ".join(f"{k}{' x' + str(n) if n > 1 else ''} {u:.1f}" for k, n, u in runs)


def composition_text(ins, path: list[int], us: list[float]) -> str:
    """A chain as its hops and, per kind, tasks x mean = total (us), largest first."""
    per: dict[str, list] = {}
    for tid in path:
        r = per.setdefault(short_kind(kind_key(ins.schedule.tasks[tid])), [0, 0.0])
        r[0] += 1
        r[1] += us[tid]
    hops = max(len(path) - 1, 0)
    parts = [f"{k} {n} x {u / n:.2f} = {u:.1f}" for k, (n, u) in sorted(per.items(), key=lambda kv: -kv[1][1])]
    return f"{hops} hops ({hops * ins.latency_us:.1f}) + " + ", ".join(parts)


def short_kind(k: str) -> str:
    return k[len("matvec/"):] if k.startswith("matvec/") else k


def layer_chains(ins, us: list[float]) -> list[dict]:
    """Per layer: tasks, weight bytes, the chain of the layer alone (the longest path through the waits
    among its own tasks), the step's chain split by layer (its part in the layer: from where it left the
    previous layer to its last task in this one, with the unlayered tasks between, e.g. residuals, and
    the hops), and when the whole step's chain and the as-scheduled step reach the layer's last task.
    A last row, layer None, is the step's tail after the last layer (final norm, LM head, argmax)."""
    s = ins.schedule
    order = topo_order(ins)
    whole = chain(ins, us, order=order)
    _, sched_end = as_scheduled(ins, us)
    by_layer: dict[int, list[int]] = defaultdict(list)
    for t in s.tasks:
        if t.layer is not None:
            by_layer[t.layer].append(t.id)
    seg_of: dict[int, int | None] = {}
    seg = None
    for tid in reversed(whole["path"]):          # unlayered tasks belong to the layer they lead into
        if s.tasks[tid].layer is not None:
            seg = s.tasks[tid].layer
        seg_of[tid] = seg
    segments: dict = defaultdict(list)
    for tid in whole["path"]:
        segments[seg_of[tid]].append(tid)
    rows, prev_end = [], 0.0
    for layer in sorted(by_layer) + [None]:
        ids = by_layer.get(layer, [])
        part = segments.get(layer, [])
        seg_us = whole["end"][part[-1]] - prev_end if part else 0.0
        if part:
            prev_end = whole["end"][part[-1]]
        if layer is None:
            if part:
                rows.append({"layer": None, "tasks": len(part), "weight_bytes": 0, "alone_us": None,
                             "segment_us": seg_us,
                             "segment": part, "step_chain_end_us": prev_end,
                             "scheduled_end_us": max(sched_end[t] for t in part)})
            continue
        c = chain(ins, us, set(ids), order)
        rows.append({"layer": layer, "tasks": len(ids), "weight_bytes": sum(weight_bytes(ins, s.tasks[t]) for t in ids),
                     "alone_us": c["us"], "alone_path": c["path"], "segment_us": seg_us, "segment": part,
                     "step_chain_end_us": max(whole["end"][t] for t in ids),
                     "scheduled_end_us": max(sched_end[t] for t in ids)})
    return rows


def groups_of_layer(ins, layer: int) -> dict:
    """The tasks of one layer by (fused op, lane): {(op, lane): [task ids]}."""
    out: dict = defaultdict(list)
    for t in ins.schedule.tasks:
        if t.layer == layer:
            out[(t.op, t.lane)].append(t.id)
    return dict(out)


def feeds(s) -> dict[int, list[int]]:
    """event -> the tasks that wait on it."""
    out: dict[int, list[int]] = defaultdict(list)
    for t in s.tasks:
        for g, _ in t.waits:
            out[g].append(t.id)
    return out


def ranges(ids) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    ids = sorted(ids)
    out = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(out)

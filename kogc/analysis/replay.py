"""How long should a step of a schedule take, given measured task times? Longest paths over the task
graph, no GPU needed:

- as scheduled: every program runs its queue in order; a task starts when the task before it in its
  queue has ended and every event it waits on is complete, plus a publish-to-acquire latency (the
  kernel's own semantics);
- the chain: the same without queues (one program per task): the dependency chain itself, the bound
  no placement can beat;
- perfect balance: all bodies over the programs;
- with overheads: as scheduled, each task also paying what a task costs its program before its body
  (measured: the median wait segment of the tasks whose data was already there, per kind) and the
  measured notify latency; close to the measured step; and the same with the overheads halved or
  removed and the notify halved. A start includes the arrival of the weight tile its task issued
  (a ready wait answers behind it: docs/design.md), so those rows are upper bounds; with a "detail"
  profile the replay also removes only the start's table reads (start to the wait's table fields
  arrived), what a cheaper start alone could buy.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np

from ..runtime.profile import kind_key, wait_split
from ..scheduler.check import run_order
from ..scheduler.tasks import parts


def longest_path(schedule, task_us: list[float], latency_us: float, queues: bool,
                 overhead_us: list[float] | None = None, event_us: dict[int, float] | None = None) -> tuple[float, dict]:
    """End time of the last task (us), and the latest end per task kind. task_us[id]: each task's
    body; with queues, overhead_us[id] (if given) is what the task costs its program before it, and
    event_us[g] (if given) the latency of a wait on event g in place of latency_us."""
    event_us = event_us or {}
    tasks, events = schedule.tasks, schedule.events
    end = [0.0] * len(tasks)
    if queues:
        done_at = [0.0] * len(events)                     # when each event's last producer ended
        last: dict[int, float] = {}                       # program -> end of its previous task
        prog = {tid: p for p, q in enumerate(schedule.queues) for tid in q}
        for tid in run_order(tasks, events, schedule.queues):    # waited events are complete by then
            t = tasks[tid]
            free = last.get(prog[tid], 0.0) + (overhead_us[tid] if overhead_us is not None else 0.0)
            waits = () if t.may_skip_waits else t.waits      # (profiles are of greedy steps: count tasks skip)
            start = max([free] + [done_at[g] + event_us.get(g, latency_us) for g, _ in waits])
            end[tid] = last[prog[tid]] = start + task_us[tid]
            for g in t.published:                          # (a shared lane event too)
                done_at[g] = max(done_at[g], end[tid])
    else:                                               # one program per task: only the exact producers
        latest_of = _latest_producer(end)
        for t in tasks:                                 # task ids follow the graph's order
            at, d = latest_of(() if t.may_skip_waits else t.deps)
            end[t.id] = (at + latency_us if d >= 0 else 0.0) + task_us[t.id]
    latest: dict[str, float] = defaultdict(float)
    for t in tasks:
        latest[kind_key(t)] = max(latest[kind_key(t)], end[t.id])
    return max(end, default=0.0), dict(latest)


def _latest_producer(end: list[float]):
    """latest(deps) -> (end, id) of the producer that ends last (the lowest id of those that tie; (0, -1) for
    none), reading `end` as the walk in task order fills it: a producer's end is final before any consumer
    asks, so a shared list of producers (Deps.shared) is looked through once."""
    shared_latest: dict[int, tuple[float, int]] = {}

    def best(ids) -> tuple[float, int]:
        at, who = 0.0, -1
        for d in ids:
            if who < 0 or end[d] > at or (end[d] == at and d < who):
                at, who = end[d], d
        return at, who

    def latest(deps) -> tuple[float, int]:
        shared, own = parts(deps)
        a = shared_latest.get(id(shared))
        if a is None:
            a = shared_latest[id(shared)] = best(shared)
        b = best(own)
        if a[1] < 0 or (b[1] >= 0 and (b[0] > a[0] or (b[0] == a[0] and b[1] < a[1]))):
            return b
        return a
    return latest


def chain_composition(schedule, task_us: list[float], latency_us: float) -> dict:
    """The chain (data-only longest path), walked back from its last task: per task kind, how many of
    its tasks lie on it and their summed body; plus the hops (each costs latency_us)."""
    tasks = schedule.tasks
    end, parent = [0.0] * len(tasks), [-1] * len(tasks)
    latest_of = _latest_producer(end)
    for t in tasks:                                     # task ids follow the graph's order
        at, d = latest_of(t.deps)
        if d >= 0 and at + latency_us > 0.0:          # (a chain starts where nothing came before)
            parent[t.id] = d
        end[t.id] = (at + latency_us if parent[t.id] >= 0 else 0.0) + task_us[t.id]
    tid = max(range(len(tasks)), key=end.__getitem__)
    kinds: dict = defaultdict(lambda: [0, 0.0])
    hops = 0
    while tid >= 0:
        k = kinds[kind_key(tasks[tid])]
        k[0] += 1
        k[1] += task_us[tid]
        tid, hops = parent[tid], hops + (parent[tid] >= 0)
    return {"chain_us": max(end), "hops": hops, "hop_us_total": hops * latency_us,
            "per_kind": {k: {"tasks": n, "us": us} for k, (n, us) in sorted(kinds.items(), key=lambda kv: -kv[1][1])}}


def measured_overheads(schedule, ids: np.ndarray, ts: np.ndarray, others=(), upto: int = 1,
                       split: tuple | None = None) -> tuple[list[float], ...]:
    """Per task: the median wait segment (start to after its waits, us) of its (kind, has waits) group
    over the tasks whose producers had ended before they started (nothing to wait for; the median of
    all of those for a group with none); and the median notify (producer end to after the waits) of
    the tasks that did wait. With `others` (the same tasks placed otherwise), also their per-task
    lists, from the same medians: (per task, notify, per task of each of others...). `upto`: the
    stamp that ends the segment (8 in a detail profile: the wait's table fields arrived; a task without
    it, inside a matvec run, ends at its after-waits stamp). split: wait_split's answer, where the caller
    has it."""
    blocked, notify = split if split is not None else wait_split(schedule, ids, ts)
    seg = (np.where(ts[:, upto] > 0, ts[:, upto], ts[:, 1]) - ts[:, 0]) / 1e3
    groups: dict = defaultdict(list)
    for j, tid in enumerate(ids):
        if blocked[j] == 0:
            t = schedule.tasks[int(tid)]
            groups[(kind_key(t), bool(t.waits))].append(seg[j])
    med = {k: float(np.median(v)) for k, v in groups.items()}
    ready = seg[blocked == 0]
    fallback = float(np.median(ready)) if len(ready) else 0.0
    waited = notify[blocked > 0]
    def per_task(s):
        return [med.get((kind_key(t), bool(t.waits)), fallback) for t in s.tasks]
    return (per_task(schedule), float(np.median(waited)) if len(waited) else 0.0, *map(per_task, others))


def replay(schedule, ids: np.ndarray, ts: np.ndarray, latencies: list[float], remote_us: list[float] = (),
           body_scale: float | None = None) -> dict:
    """Every replay of one profiled step: the measured span, perfect balance, as scheduled and the
    chain at each hop latency, and as scheduled with the measured overheads. A mirrored rank's profile
    (kogc bench --gpus G --mirror) with `remote_us`: also with every wait on a received sum taking each
    of those latencies (a hop across GPUs) instead of the measured notify. With `body_scale`: also, one
    task kind at a time, with that kind's bodies scaled by it (which kinds' bodies the step waits for)."""
    from .stamps import body_us
    task_us = body_us(schedule, ids, ts)
    rows = []
    for lat in latencies:
        rows.append({"latency_us": lat, "as_scheduled_us": longest_path(schedule, task_us, lat, True)[0],
                     "chain_us": longest_path(schedule, task_us, lat, False)[0]})
    split = wait_split(schedule, ids, ts)
    over, notify = measured_overheads(schedule, ids, ts, split=split)
    # the same replay with the start overheads and the notify latency scaled (upper bounds for a cheaper
    # start: an overhead includes the task's tile arriving) and, from a detail profile, with only the
    # starts' table reads removed
    whatif = [{"overhead_scale": f, "notify_scale": g,
               "as_scheduled_us": longest_path(schedule, task_us, notify * g, True, [o * f for o in over])[0]}
              for f in (1.0, 0.5, 0.0) for g in (1.0, 0.5) if (f, g) != (1.0, 1.0)]
    w = {"notify_us": notify, "as_scheduled_us": longest_path(schedule, task_us, notify, True, over)[0],
         "overhead_per_program_us": _per_program_mean(schedule, over), "whatif": whatif}
    if remote_us and schedule.exchanges:
        from ..scheduler.ranks import exchange_events
        stand_ins = exchange_events(schedule)
        w["remote"] = [{"remote_us": r, "as_scheduled_us": longest_path(schedule, task_us, notify, True, over,
                                                                        dict.fromkeys(stand_ins, r))[0]}
                       for r in remote_us]
    if body_scale is not None:
        w["body_scale"] = body_scale
        w["by_kind"] = sorted(({"kind": k, "tasks": n, "as_scheduled_us": longest_path(
            schedule, [u * body_scale if kind_key(t) == k else u for u, t in zip(task_us, schedule.tasks)],
            notify, True, over)[0]} for k, n in Counter(kind_key(t) for t in schedule.tasks).items()),
            key=lambda x: x["as_scheduled_us"])
    if ts.shape[1] >= 9 and (ts[:, 8] > 0).any():
        table = measured_overheads(schedule, ids, ts, upto=8, split=split)[0]
        w["table_per_program_us"] = _per_program_mean(schedule, table)
        w["table_free_us"] = longest_path(schedule, task_us, notify, True,
                                          [max(o - r, 0.0) for o, r in zip(over, table)])[0]
    return {"tasks": len(schedule.tasks), "programs": len(schedule.queues),
            "measured_span_us": float(ts[:, 2].max() - ts[:, 0].min()) / 1e3,
            "balanced_us": sum(task_us) / len(schedule.queues), "rows": rows, "with_overheads": w}


def _per_program_mean(schedule, per_task: list[float]) -> float:
    """The mean over programs of the sum of per_task over each program's queue."""
    return float(np.mean([sum(per_task[t] for t in q) for q in schedule.queues]))


def same_tasks(a, b) -> bool:
    """Whether two schedules hold the same tasks (kinds and exact producers, by id): placements of one
    task graph, whose measured bodies carry over from one to the other."""
    return len(a.tasks) == len(b.tasks) and all(
        kind_key(x) == kind_key(y) and list(x.deps) == list(y.deps) for x, y in zip(a.tasks, b.tasks))


def replay_placement(profiled, others, ids: np.ndarray, ts: np.ndarray, attention_scales: list[float] = ()) -> list:
    """The profiled step's tasks, with their measured bodies, start overheads and notify latency,
    replayed in other placements' queues and waits (`others`: an iterable of schedules of the same tasks, see
    same_tasks, taken one at a time), each beside the profiled placement replayed the same way: placements
    ranked on the CPU (kogc analyze replay --place-with). attention_scales: also each with attention's bodies
    times each scale (a longer context, whose splits read more of the cache: the queues are placed once and
    serve every context).
    One result per schedule of `others`, in their order."""
    from .stamps import body_us
    task_us = body_us(profiled, ids, ts)
    split = wait_split(profiled, ids, ts)
    over_a, notify = measured_overheads(profiled, ids, ts, split=split)
    scales = [1.0, *attention_scales]
    bodies = [[u * f if t.kind == "attention" else u for u, t in zip(task_us, profiled.tasks)] for f in scales]
    base = [longest_path(profiled, us, notify, True, over_a)[0] for us in bodies]
    results = []
    for other in others:          # one at a time: a schedule of laneformer-2b's tasks holds hundreds of MB
        over_b = measured_overheads(profiled, ids, ts, (other,), split=split)[2]
        spans = [longest_path(other, us, notify, True, over_b)[0] for us in bodies]
        scaled = [{"attention_scale": f, "profiled_us": a, "other_us": b, "change": b / a - 1}
                  for f, a, b in zip(scales[1:], base[1:], spans[1:])]
        results.append({"profiled_us": base[0], "other_us": spans[0], "change": spans[0] / base[0] - 1,
                        "by_attention_scale": scaled,
                        "waits": [sum(len(t.waits) for t in s.tasks) for s in (profiled, other)],
                        "programs_changed": sum(qa != qb for qa, qb in zip(profiled.queues, other.queues))
                        + abs(len(profiled.queues) - len(other.queues))})
    return results


def format_replay(r: dict) -> str:
    lines = [f"{r['tasks']} tasks on {r['programs']} programs: measured step span {r['measured_span_us']:.1f} us; "
             f"all bodies / programs (perfect balance) {r['balanced_us']:.1f} us",
             f"{'hop latency us':>14} | {'as scheduled (queues + waits) us':>32} | {'the chain (data only) us':>24}"]
    for row in r["rows"]:
        lines.append(f"{row['latency_us']:14.2f} | {row['as_scheduled_us']:32.1f} | {row['chain_us']:24.1f}")
    w = r["with_overheads"]
    lines.append(f"as scheduled with the measured start overheads and notify ({w['notify_us']:.2f} us): "
                 f"{w['as_scheduled_us']:.1f} us")
    lines.append(f"start overheads: {w['overhead_per_program_us']:.1f} us a program (mean); the same replay "
                 f"with them and the notify scaled:")
    for x in w["whatif"]:
        lines.append(f"  overheads x{x['overhead_scale']:.1f}, notify x{x['notify_scale']:.1f}: "
                     f"{x['as_scheduled_us']:.1f} us ({x['as_scheduled_us'] / w['as_scheduled_us'] - 1:+.1%})")
    lines.append("  (upper bounds: a start includes its weight tile's arrival, which a cheaper start does not remove)")
    if "table_free_us" in w:
        lines.append(f"  the starts' table reads alone (start to the wait's table fields, {w['table_per_program_us']:.1f} us "
                     f"a program) free: {w['table_free_us']:.1f} us "
                     f"({w['table_free_us'] / w['as_scheduled_us'] - 1:+.1%})")
    if "by_kind" in w:
        lines.append(f"  one kind's bodies x{w['body_scale']:g} at a time (the rest as measured):")
        for x in w["by_kind"]:
            lines.append(f"    {x['kind']:34} {x['tasks']:7} tasks: {x['as_scheduled_us']:.1f} us "
                         f"({x['as_scheduled_us'] / w['as_scheduled_us'] - 1:+.1%})")
        lines.append("    (the queues and waits as profiled: an upper bound where a kind's tasks share HBM)")
    for x in w.get("remote", []):
        lines.append(f"  every wait on a peer's sum {x['remote_us']:g} us (a hop across GPUs): {x['as_scheduled_us']:.1f} us "
                     f"({x['as_scheduled_us'] / w['as_scheduled_us'] - 1:+.1%})")
    for p in r.get("placed_with", []):
        lines.append(f"placed with {p['tile_config']}: {p['other_us']:.1f} us against {p['profiled_us']:.1f} "
                     f"({p['change']:+.1%}); {p['programs_changed']} of {r['programs']} programs' queues differ; "
                     f"waits per step {p['waits'][1]} against {p['waits'][0]}")
        for x in p["by_attention_scale"]:
            lines.append(f"  attention's bodies x{x['attention_scale']:g}: {x['other_us']:.1f} us against "
                         f"{x['profiled_us']:.1f} ({x['change']:+.1%})")
    if len(r.get("placed_with", [])) > 1:
        lines.append(format_placement_ranking(r["placed_with"]))
    return "\n".join(lines)


def format_placement_ranking(placed: list) -> str:
    """The placements of one replay as a table, best first by their mean change over the attention scales
    (x1 included): one row each, the change at each scale against the profiled placement."""
    scales = [1.0] + [x["attention_scale"] for x in placed[0]["by_attention_scale"]]
    def changes(p):
        return [p["change"]] + [x["change"] for x in p["by_attention_scale"]]
    ranked = sorted(placed, key=lambda p: float(np.mean(changes(p))))
    head = " | ".join(f"x{f:g}" for f in scales)
    lines = [f"ranked by the mean change (attention's bodies {head}), against the profiled placement:"]
    for p in ranked:
        cells = " | ".join(f"{c:+6.1%}" for c in changes(p))
        lines.append(f"  {cells} | mean {float(np.mean(changes(p))):+6.1%} | {json.dumps(p['tile_config'])}")
    return "\n".join(lines)


def format_chain(c: dict, latency_us: float) -> str:
    lines = [f"the chain at {latency_us:g} us per hop: {c['chain_us']:.1f} us = {c['hops']} hops "
             f"({c['hop_us_total']:.1f} us) + the bodies of:"]
    for k, v in c["per_kind"].items():
        lines.append(f"  {k:34} {v['tasks']:4d} tasks {v['us']:8.1f} us (mean {v['us'] / v['tasks']:.2f})")
    return "\n".join(lines)

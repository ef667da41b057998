"""What-if, before building it: W2 split over its input (K) into S slices. Slice s of W2 would wait
only for the W1/W3 tasks that write slice s of the hidden vector (today every W2 task waits for all
of them), so W2 could start on the first finished slices. Each W2 task is charged `extra_us` more for
what the split costs (an arrival counter, the last arriver summing the S partials). The split graph
is placed like the real one (`place_parallel`, the target's kind times) and replayed with a
profile's measured kind means and start overheads (`critical_path.replay_with_overheads`).

    python scripts/split_w2_replay.py --task-times docs/results/2026-11-30-task-times-2b-1024-s8.npz \
        --slices 1,2,4 --extra-us 0,1,2

The stamps must come from the same preset and settings (the default placement). Ninth session,
laneformer-2b: 1,323 us unsplit; S=2: 1,327 / 1,401 / 1,473 us at 0 / 1 / 2 us extra; S=4: 1,338 /
1,414 / 1,482: no gain even if the split were free. About 50 s per configuration on 2b.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from types import SimpleNamespace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), os.path.join(ROOT, "scripts"), ROOT]
import critical_path as cp  # noqa: E402
import laneformer as lf  # noqa: E402

from kogc.frontend import to_ir  # noqa: E402
from kogc.runtime.profile import kind_key, load_stamps  # noqa: E402
from kogc.scheduler import TileConfig, build_schedule  # noqa: E402
from kogc.scheduler.check import prune_by_program_order  # noqa: E402
from kogc.scheduler.deps import Event  # noqa: E402
from kogc.scheduler.fuse import fuse  # noqa: E402
from kogc.scheduler.schedule import derive_events, place_tasks, placement_seconds  # noqa: E402
from kogc.scheduler.tile import tile  # noqa: E402
from kogc.targets import get_target  # noqa: E402

W2_KINDS = ("matvec/silu_mul/residual", "matvec/silu_mul/store")


def split_w2(graph, cfg: TileConfig, slices: int) -> tuple[list, list]:
    """Tasks and events with every event that only W2 tasks wait on (W1/W3's) cut into `slices`
    events by the hidden rows their producers write (in each producing op, its tasks in row order,
    cut into equal runs); W2 task j of an (op, lane) waits on slice j % slices, and its exact
    producers shrink to that slice's."""
    tasks, _ = tile(graph, fuse(graph), cfg)
    events = derive_events(tasks, cfg)
    if slices == 1:
        return tasks, events
    waited_by = defaultdict(set)
    for t in tasks:
        for g, _ in t.waits:
            waited_by[g].add(kind_key(t))
    out = [Event(e.id, e.name, list(e.tasks)) for e in events]
    parts: dict[int, list[int]] = {}
    for e in events:
        if not waited_by[e.id] or not waited_by[e.id] <= set(W2_KINDS):
            continue
        by_op = defaultdict(list)
        for tid in e.tasks:
            by_op[tasks[tid].op].append(tid)
        cut = [[] for _ in range(slices)]
        for ids in by_op.values():
            ids.sort(key=lambda i: tasks[i].writes[0].start)
            for i, tid in enumerate(ids):
                cut[i * slices // len(ids)].append(tid)
        parts[e.id] = [e.id]
        out[e.id].tasks = sorted(cut[0])
        for s in range(1, slices):
            out.append(Event(len(out), f"{e.name}/slice{s}", sorted(cut[s])))
            parts[e.id].append(len(out) - 1)
        for g in parts[e.id]:
            for tid in out[g].tasks:
                tasks[tid].group = g
    seen = defaultdict(int)
    for t in tasks:
        for k, (g, _) in enumerate(t.waits):
            if g in parts:
                j = seen[(t.op, t.lane)]
                seen[(t.op, t.lane)] += 1
                mine = parts[g][j % slices]
                t.waits[k] = (mine, len(out[mine].tasks))
                others = {x for p in parts[g] if p != mine for x in out[p].tasks}
                t.deps = [d for d in t.deps if d not in others]
    return tasks, out


def place_and_replay(tasks, events, target, cfg, body_us: dict, overhead: dict, fallback: float,
                     notify: float, extra_us: float) -> float:
    """Place the tasks as build_schedule does (W2 tasks extra_us longer), prune program-order waits,
    and replay with each kind's mean body and each (kind, has waits)'s start overhead."""
    P = target.num_programs
    secs = placement_seconds(tasks, cfg, target, P)
    secs = [x + (extra_us * 1e-6 if kind_key(t) in W2_KINDS else 0.0) for x, t in zip(secs, tasks)]
    queues, _ = place_tasks(tasks, events, target, cfg, P, secs)
    prune_by_program_order(tasks, events, queues)
    sched = SimpleNamespace(tasks=tasks, events=events, queues=queues)
    dur = [body_us[kind_key(t)] + (extra_us if kind_key(t) in W2_KINDS else 0.0) for t in tasks]
    over = [overhead.get((kind_key(t), bool(t.waits)), fallback) for t in tasks]
    return cp.replay_with_overheads(sched, dur, over, notify)


def profile_means(schedule, path: str) -> tuple[dict, dict, float, float]:
    """From a profile of `schedule`: mean body per kind, and `critical_path.overhead_medians` (start
    overhead per (kind, has waits), its fallback, the median notify)."""
    ids, ts, body = load_stamps(path, schedule)
    bodies = defaultdict(list)
    for t in schedule.tasks:
        bodies[kind_key(t)].append(body[t.id])
    return ({k: float(np.mean(v)) for k, v in bodies.items()}, *cp.overhead_medians(schedule, ids, ts))


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="laneformer-2b")
    ap.add_argument("--task-times", required=True, help="stamps of the default placement (sweep.py, profile)")
    ap.add_argument("--slices", default="1,2,4")
    ap.add_argument("--extra-us", default="0,1,2")
    args = ap.parse_args(argv)
    target, cfg = get_target("h200"), TileConfig()
    graph = to_ir(lf.kogc_model(args.preset, device="meta", seed=None))
    body, over, fallback, notify = profile_means(build_schedule(graph, target, "parallel", cfg), args.task_times)
    rows = []
    for s in (int(x) for x in args.slices.split(",")):
        for extra in ((0.0,) if s == 1 else tuple(float(x) for x in args.extra_us.split(","))):
            tasks, events = split_w2(graph, cfg, s)
            us = place_and_replay(tasks, events, target, cfg, body, over, fallback, notify, extra)
            rows.append({"slices": s, "extra_us": extra, "replay_us": us})
            print(f"W2 in {s} slice(s), +{extra:g} us per W2 task: replay {us:.1f} us", flush=True)
    return rows


if __name__ == "__main__":
    main()

"""No GPU needed: would running a program's queue slightly out of order pay? A what-if replay.

Today every program runs its queue strictly in order, so a task whose input is late blocks the
ready tasks behind it (head-of-line blocking): the sixth session's replays put the placed schedule
~1.5x above both its dependency chain and its balance. Here a program may instead start any of the
first `window` unfinished tasks of its queue, whichever can start first; one that is not the head
costs `probe_us` more (the polls of the tasks ahead of it). window 1 is today's kernel.

An event-driven replay with each task's measured duration (a profile's per-task times) and a fixed
publish-to-acquire latency; tasks wait for their exact producers' events (no program-order pruning,
which a reordering queue could not use as is). The placement is the config's, made for in-order
queues. (performance-notes.md's figures replayed the sixth session's placement, before the seventh
session changed the defaults; the per-task times are keyed by task id, which placement does not change.)

    python scripts/window_replay.py --task-times docs/results/2026-11-30-task-times-2b-1024-s6.npz \
        [--windows 1,2,3,4,8] [--latency-us 1] [--probe-us 0,0.5,1] [--tile-config JSON] \
        [--shared [--stagger-us 10]]
"""
from __future__ import annotations

import argparse
import heapq
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]


def window_replay(schedule, dur: list[float], window: int, latency_us: float, probe_us: float,
                  shared: list[int] | None = None) -> tuple[float, list[float]]:
    """End of the last task (us) when each program starts, of the first `window` unfinished tasks of
    its queue, the one that can start first (ties: queue order), and every task's start. shared: one
    list for all programs instead (every task, in an order that honours the dependencies), so any
    program may take any of its first `window` tasks: list scheduling at run time."""
    tasks, events = schedule.tasks, schedule.events
    groups = [sorted({tasks[d].group for d in t.all_deps}) for t in tasks]
    left = [len(e.tasks) for e in events]           # producers not yet ended, per event
    done_at = [0.0] * len(events)
    only_on = [None] * len(events)                   # the one program all of an event's producers ran on, or -1
    if shared is not None:
        one = list(shared)
        pending = [one] * len(schedule.queues)       # the same list object: a start removes for all
    else:
        pending = [list(q) for q in schedule.queues]     # unstarted tasks per program, in queue order
    watchers: dict[int, set[int]] = {}               # event -> programs whose window waits on it
    plan = [None] * len(pending)                     # program -> (start, tid, version) it is waiting for
    version = [0] * len(pending)
    heap: list[tuple] = []                           # (time, kind 0 end / 1 start, program, tid, version)
    free_at = [0.0] * len(pending)
    busy = [False] * len(pending)
    started: set[int] = set()
    starts = [0.0] * len(tasks)
    idle: set[int] = set()                           # programs free with nothing in their window ready
    finish = 0.0

    def choose(p: int, now: float):
        best = None
        for i, tid in enumerate(pending[p][:window]):
            if any(left[g] for g in groups[tid]):
                for g in groups[tid]:
                    if left[g]:
                        watchers.setdefault(g, set()).add(p)
                continue
            # (a program's own earlier writes need no hop: the in-order kernel prunes those waits)
            ready = max((done_at[g] + (0.0 if only_on[g] == p else latency_us) for g in groups[tid]), default=0.0)
            start = max(now, ready) + (probe_us if i else 0.0)
            if best is None or start < best[0]:
                best = (start, tid)
        if best is None and plan[p] is None:
            idle.add(p)
        else:
            idle.discard(p)
        if best is not None and (plan[p] is None or best[0] < plan[p][0]):
            version[p] += 1
            plan[p] = (best[0], best[1], version[p])
            heapq.heappush(heap, (best[0], 1, p, best[1], version[p]))

    for p in range(len(pending)):
        choose(p, 0.0)
    while heap:
        now, kind, p, tid, ver = heapq.heappop(heap)
        if kind == 0:                                # task tid ended on program p
            finish = max(finish, now)
            busy[p] = False
            free_at[p] = now
            g = tasks[tid].group
            left[g] -= 1
            done_at[g] = max(done_at[g], now)
            only_on[g] = p if only_on[g] in (None, p) else -1
            if left[g] == 0:
                for q in watchers.pop(g, ()):
                    if not busy[q]:
                        choose(q, max(now, free_at[q]))
            choose(p, now)
        elif ver == version[p] and not busy[p]:      # start the planned task (if still the plan)
            plan[p] = None
            if tid not in started:
                pending[p].remove(tid)
                started.add(tid)
                starts[tid] = now
                busy[p] = True
                idle.discard(p)
                heapq.heappush(heap, (now + dur[tid], 0, p, tid, 0))
                if shared is not None and idle:                  # a task entered the shared window: an idle
                    choose(next(iter(idle)), now)    # program may take it (they are all alike)
            else:                                    # (shared list) another program took it first
                choose(p, now)
    if any(pending):
        stuck = next(p for p in range(len(pending)) if pending[p])
        raise RuntimeError(f"replay stuck: program {stuck} still holds {len(pending[stuck])} tasks")
    return finish, starts


def main(argv=None) -> list[dict]:
    import laneformer as lf
    from kogc.bench.measure import write_result
    from kogc.frontend import to_ir
    from kogc.runtime.profile import load_stamps
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.scheduler.tile import tile_config_from_json
    from kogc.targets import get_target
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="laneformer-2b")
    ap.add_argument("--task-times", required=True, help=".npz from sweep.py with \"profile\": true")
    ap.add_argument("--tile-config", help="JSON of TileConfig fields (those of the profiled run)")
    ap.add_argument("--windows", default="1,2,3,4,8")
    ap.add_argument("--latency-us", type=float, default=1.0)
    ap.add_argument("--probe-us", default="0,0.5,1")
    ap.add_argument("--stagger-us", type=float, default=0.0, help="with --shared: the upper half of the lanes "
                                                                     "this much later in the list (out of phase)")
    ap.add_argument("--shared", action="store_true", help="one list for all programs, in the order tasks start "
                                                        "in the in-order replay (see window_replay)")
    args = ap.parse_args(argv)
    cfg = tile_config_from_json(args.tile_config) if args.tile_config else TileConfig()
    schedule = build_schedule(to_ir(lf.kogc_model(args.preset, device="meta", seed=None)), get_target("h200"),
                              "parallel", cfg)
    _, ts, dur = load_stamps(args.task_times, schedule)
    span = float(ts[:, 2].max() - ts[:, 0].min()) / 1e3
    in_order, starts = window_replay(schedule, dur, 1, args.latency_us, 0.0)    # today's kernel
    lanes = max(t.lane for t in schedule.tasks) + 1
    half = lambda t: args.stagger_us if schedule.tasks[t].lane >= lanes // 2 else 0.0  # noqa: E731
    by_start = sorted(range(len(dur)), key=lambda t: (starts[t] + half(t), t))     # the shared list's order
    print(f"measured span {span:.1f} us; in-order replay (window 1, as critical_path.py replays it) "
          f"{in_order:.1f} us; balance {sum(dur) / len(schedule.queues):.1f} us; hop {args.latency_us:g} us")
    rows = []
    for w in (int(x) for x in args.windows.split(",")):
        for probe in (float(x) for x in args.probe_us.split(",")):
            if w == 1 and probe:
                continue
            us, _ = window_replay(schedule, dur, w, args.latency_us, probe, by_start if args.shared else None)
            rows.append({"window": w, "probe_us": probe, "shared": args.shared, "replay_us": us})
            print(f"{'shared ' if args.shared else ''}window {w}, probe {probe:g} us: {us:.1f} us "
                  f"({(us - in_order) / in_order:+.1%} vs in order)", flush=True)
    write_result("window_replay.json", rows)
    return rows


if __name__ == "__main__":
    main()

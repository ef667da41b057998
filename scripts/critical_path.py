"""No GPU needed: how long should a step of a schedule take, given measured task times? Two answers
from the same task graph, each a longest path:

- "as scheduled": every program runs its queue in order; a task starts when the task before it in
  its queue has ended and every event it waits on is complete, plus a publish-to-acquire latency.
  This is the kernel's own semantics; if it matches the measured step time, the model can rank
  placements offline.
- "data only": the same without queues (one program per task): the dependency chain itself, the
  bound no placement can beat.

Task body times come from a `%globaltimer` profile summary (per task kind, e.g. the launch probe's).

    python scripts/critical_path.py --preset laneformer-2b \
        [--profile docs/results/2026-11-29-launch_probe.json] [--latency-us 0.5,1,2,4] [--tile-config JSON]
        [--task-times task-times-1024.npz [--placements '[{"measured": true, "wait_latency_us": 1}, ...]']] [--chain]
        [--fold-mlp 1,1.5,2.5] [--task-times ... --overheads [--wait-overhead-us 1,0.5]]

--placements (with --task-times) re-places the same tasks several ways and replays each with the
measured task times, to rank placements offline: each entry may set "measured" (true: the
placement's cost model uses each task's measured duration instead of bytes; "kind_means": the mean
measured duration of its task kind), "wait_latency_us" (the placement
adds this between a producer's end and its consumer's start), "attn_cost_scale" and "lane_stagger".
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]
import laneformer as lf  # noqa: E402

from kogc.frontend import to_ir  # noqa: E402
from kogc.runtime.profile import kind_key  # noqa: E402
from kogc.scheduler.check import run_order  # noqa: E402
from kogc.scheduler import TileConfig, build_schedule  # noqa: E402
from kogc.scheduler.tile import tile_config_from_json  # noqa: E402
from kogc.targets import get_target  # noqa: E402


def longest_path(schedule, body_us, latency_us: float, queues: bool, task_us=None,
                 overhead_us=None) -> tuple[float, dict]:
    """End time of the last task (us), and the latest end per task kind. Task durations: task_us[id]
    if given (measured per task), else body_us[kind]. With queues, overhead_us[id] (if given) is what
    the task costs its program before its body (see replay_with_overheads)."""
    tasks, events = schedule.tasks, schedule.events
    dur = task_us if task_us is not None else [body_us[kind_key(t)] for t in tasks]
    end = [0.0] * len(tasks)
    if queues:
        done_at = [0.0] * len(events)                     # when each event's last producer ended
        last = {}                                         # program -> end of its previous task
        prog = {tid: p for p, q in enumerate(schedule.queues) for tid in q}
        for tid in run_order(tasks, events, schedule.queues):    # waited events are complete by then
            t = tasks[tid]
            free = last.get(prog[tid], 0.0) + (overhead_us[tid] if overhead_us is not None else 0.0)
            start = max([free] + [done_at[g] + latency_us for g, _ in t.waits]
                        + [end[d] + latency_us for d in t.ll_deps])     # flagged reads: their producers
            end[tid] = last[prog[tid]] = start + dur[tid]
            done_at[t.group] = max(done_at[t.group], end[tid])
    else:                                               # one program per task: only the exact producers
        for t in tasks:                                 # task ids follow the graph's order
            assert all(d < t.id for d in t.all_deps), f"task {t.id} depends on a later task"
            start = max((end[d] + latency_us for d in t.all_deps), default=0.0)
            end[t.id] = start + dur[t.id]
    latest = defaultdict(float)
    for t in tasks:
        latest[kind_key(t)] = max(latest[kind_key(t)], end[t.id])
    return max(end), dict(latest)


def replay_with_overheads(schedule, task_us, overhead_us, notify_us: float) -> float:
    """The in-order replay with what a task costs its program before its body: task t's body starts
    at max(its program's previous end + overhead_us[t], its events' last producer end + notify_us).
    Measured (2b, seventh-session placement): a task whose data was ready before it started still
    spends ~1.4-1.5 us between its start and its body when it has a wait and ~0.2-0.3 us without;
    a task that waited resumes ~0.55 us after its producer ended. With those the replay of the
    eighth session's profile is 1,388 us against the 1,445 measured (4% short), where
    `longest_path` without overheads gives 1,120 (22% short). Do not cut the overheads alone in a
    what-if: the weights stream during the wait, so a body is shorter by about as much as its wait
    segment is longer (ninth session: 1.54 + 1.66 us with a wait, 0.19 + 2.69 us without)."""
    return longest_path(schedule, None, notify_us, True, task_us, overhead_us)[0]


def overhead_medians(schedule, ids, ts) -> tuple[dict, float, float]:
    """The median wait segment (start to after its waits, us) per (task kind, has waits) over the
    tasks whose producers had ended before they started (nothing to wait for), the median over all
    of those (for a group the profile lacks), and the median notify of the tasks that did wait
    (producer end to after the waits)."""
    import numpy as np

    from kogc.runtime.profile import wait_split
    blocked, notify = wait_split(schedule, ids, ts)
    seg = (ts[:, 1] - ts[:, 0]) / 1e3
    groups = defaultdict(list)
    for j, tid in enumerate(ids):
        if blocked[j] == 0:
            t = schedule.tasks[int(tid)]
            groups[(kind_key(t), bool(t.waits))].append(seg[j])
    waited = notify[blocked > 0]
    return ({k: float(np.median(v)) for k, v in groups.items()}, float(np.median(seg[blocked == 0])),
            float(np.median(waited)) if len(waited) else 0.0)


def measured_overheads(schedule, ids, ts) -> tuple[list[float], float]:
    """Per task: its (kind, has waits) group's median ready wait segment (`overhead_medians`); and the
    median notify."""
    med, fallback, notify = overhead_medians(schedule, ids, ts)
    return [med.get((kind_key(t), bool(t.waits)), fallback) for t in schedule.tasks], notify


def chain_composition(schedule, dur, latency_us: float) -> dict:
    """The data-only longest path, walked back from its last task: per task kind, how many of its
    tasks lie on it and their summed duration; plus the hops (each costs latency_us)."""
    tasks = schedule.tasks
    end, parent = [0.0] * len(tasks), [-1] * len(tasks)
    for t in tasks:                                     # task ids follow the graph's order
        start = 0.0
        for d in t.all_deps:
            if end[d] + latency_us > start:
                start, parent[t.id] = end[d] + latency_us, d
        end[t.id] = start + dur[t.id]
    tid = max(range(len(tasks)), key=end.__getitem__)
    kinds, hops = defaultdict(lambda: [0, 0.0]), 0
    while tid >= 0:
        k = kinds[kind_key(tasks[tid])]
        k[0] += 1
        k[1] += dur[tid]
        tid, hops = parent[tid], hops + (parent[tid] >= 0)
    return {"chain_us": max(end), "hops": hops, "hop_us_total": hops * latency_us,
            "per_kind": {k: {"tasks": n, "us": us} for k, (n, us) in sorted(kinds.items(), key=lambda kv: -kv[1][1])}}


def _mlp_kinds(schedule) -> tuple[list[bool], list[bool]]:
    """Per task: is it a W2 task (silu-mul prologue), is it a W1/W3 task (rmsnorm prologue, stored)?"""
    kinds = [kind_key(t) for t in schedule.tasks]
    return [k.startswith("matvec/silu_mul") for k in kinds], [k == "matvec/rmsnorm/store" for k in kinds]


def fold_mlp_schedule(schedule, dur, extra_us: float):
    """The same what-if as a placed schedule: the W2 tasks removed, whoever waited for W2's event waits
    for the W1/W3 event W2 waited for, each W1/W3 task `extra_us` longer, placed afresh by the bytes
    model on as many programs. Returns (a schedule-like namespace for longest_path, durations)."""
    import dataclasses
    from types import SimpleNamespace

    from kogc.scheduler.deps import Event
    from kogc.scheduler.place import place_parallel
    tasks = schedule.tasks
    is_w2, is_w13 = _mlp_kinds(schedule)
    w2 = {t.id for t in tasks if is_w2[t.id]}
    keep = [t for t in tasks if t.id not in w2]
    new = {t.id: i for i, t in enumerate(keep)}
    events = [Event(e.id, e.name, [new[x] for x in e.tasks if x not in w2]) for e in schedule.events]
    # by events (the replay needs only waits): W2's event stands for the events W2 waited on, a W2
    # event among those (a residual term: another lane's older W2) for its W1/W3 event, one level
    w2_events = {t.group for t in tasks if t.id in w2}
    feeds: dict[int, set] = defaultdict(set)
    for t in tasks:
        if t.id in w2:
            feeds[t.group] |= {tasks[d].group for d in t.deps}
    stand_in = {g: {x for e in srcs for x in ((feeds[e] - w2_events) if e in w2_events else {e})}
                for g, srcs in feeds.items()}
    folded = []
    for t in keep:      # waits follow the exact producers, as before pruning
        groups = {tasks[d].group for d in t.deps}
        groups = set().union(*(stand_in[g] if g in w2_events else {g} for g in groups)) if groups else set()
        waits = sorted((g, events[g].need) for g in groups)
        folded.append(dataclasses.replace(t, id=new[t.id], deps=[], waits=waits))
    fdur = [dur[t.id] + (extra_us if is_w13[t.id] else 0.0) for t in keep]
    P = len(schedule.queues)
    queues, _ = place_parallel(folded, events, P, schedule.target.hbm_read_bw / P)
    return SimpleNamespace(tasks=folded, events=events, queues=queues), fdur


def fold_mlp_chain(schedule, dur, latency_us: float, extra_us: float) -> float:
    """What-if for the MLP as one phase (performance-notes.md, sixth session): the data-only chain
    with every W2 task (`silu_mul` prologue) folded into its W1/W3 producers (`rmsnorm/store`): W2
    takes no time and no hop after them, and each W1/W3 task takes `extra_us` longer (its share of
    W2's weights and the fp32 reduction). Only the chain: the queues would change with the tasks."""
    w2, w13 = _mlp_kinds(schedule)
    fused = [0.0 if w2[i] else dur[i] + (extra_us if w13[i] else 0.0) for i in range(len(dur))]
    end = [0.0] * len(schedule.tasks)
    for t in schedule.tasks:                            # task ids follow the graph's order
        start = max((end[d] + (0.0 if w2[t.id] and w13[d] else latency_us) for d in t.all_deps), default=0.0)
        end[t.id] = start + fused[t.id]
    return max(end)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="laneformer-2b")
    ap.add_argument("--profile", default=os.path.join(ROOT, "docs", "results", "2026-11-29-launch_probe.json"))
    ap.add_argument("--profile-key", default="profile_nsteps1", help="where the summary sits in that JSON")
    ap.add_argument("--latency-us", default="1.0", help="publish -> acquire latency per wait (comma-separated: several)")
    ap.add_argument("--tile-config", help="JSON of TileConfig fields")
    ap.add_argument("--task-times", help="per-task timestamps (.npz from sweep.py with \"profile\": true, same "
                                         "preset and settings): replay each task's own body time, not its kind's mean")
    ap.add_argument("--placements", help="JSON list of placement variants to rank with --task-times (see above)")
    ap.add_argument("--fold-mlp", help="what-if, comma-separated us: the chain with W2 folded into W1/W3, "
                                       "each W1/W3 task this much longer (see fold_mlp_chain)")
    ap.add_argument("--overheads", action="store_true", help="with --task-times: also replay with each task's "
                    "measured start overhead and notify latency (replay_with_overheads)")
    ap.add_argument("--wait-overhead-us", help="what-if with --overheads, comma-separated us: tasks with waits "
                                               "cost their program at most this much before their body")
    ap.add_argument("--chain", action="store_true", help="print what the chain is made of (per task kind, at the "
                                                        "first --latency-us)")
    args = ap.parse_args(argv)
    with open(args.profile) as f:
        prof = json.load(f)
    summary = prof[args.profile_key] if args.profile_key else prof
    body_us = {k: v["body_us_mean"] for k, v in summary["per_kind"].items()}
    cfg = tile_config_from_json(args.tile_config) if args.tile_config else TileConfig()
    model = lf.kogc_model(args.preset, seed=0)
    schedule = build_schedule(to_ir(model), get_target("h200"), "parallel", cfg)
    missing = {kind_key(t) for t in schedule.tasks} - set(body_us)
    if missing and not args.task_times:      # (per-task times need no per-kind means)
        raise SystemExit(f"the profile has no body time for task kinds {sorted(missing)}")
    task_us = None
    if args.task_times:
        from kogc.runtime.profile import format_summary, load_stamps, summarize_times
        ids, ts, task_us = load_stamps(args.task_times, schedule)
        print(format_summary(summarize_times(schedule, ids, ts)), flush=True)
    dur = task_us if task_us is not None else [body_us[kind_key(t)] for t in schedule.tasks]
    total = sum(dur)
    span = summary.get("span_us")
    if args.task_times:     # the span of the run the per-task times come from, not the summary's
        span = float(ts[:, 2].max() - ts[:, 0].min()) / 1e3
    res = {"measured_span_us": span, "balanced_bound_us": total / len(schedule.queues), "rows": []}
    print(f"{args.preset}: {len(schedule.tasks)} tasks on {len(schedule.queues)} programs; measured step span "
          f"(profile) {res['measured_span_us'] or float('nan'):.1f} us; all bodies / programs (perfect balance) "
          f"{res['balanced_bound_us']:.1f} us")
    print("latency us | as scheduled (queues + waits) us | data only (the chain) us")
    for lat in (float(x) for x in args.latency_us.split(",")):
        sched, _ = longest_path(schedule, body_us, lat, True, task_us)
        chain, _ = longest_path(schedule, body_us, lat, False, task_us)
        res["rows"].append({"latency_us": lat, "as_scheduled_us": sched, "data_only_us": chain})
        print(f"{lat:10.2f} | {sched:31.1f} | {chain:24.1f}", flush=True)
    if args.overheads:
        if task_us is None:
            raise SystemExit("--overheads needs --task-times")
        over, notify = measured_overheads(schedule, ids, ts)
        res["overheads"] = {"notify_us": notify, "as_scheduled_us": replay_with_overheads(schedule, task_us, over,
                                                                                            notify), "what_if": []}
        print(f"with measured overheads (notify {notify:.2f} us): as scheduled "
              f"{res['overheads']['as_scheduled_us']:.1f} us")
        for cap in (float(x) for x in (args.wait_overhead_us or "").split(",") if x):
            capped = [min(o, cap) if t.waits else o for o, t in zip(over, schedule.tasks)]
            r = replay_with_overheads(schedule, task_us, capped, notify)
            res["overheads"]["what_if"].append({"wait_overhead_us": cap, "as_scheduled_us": r})
            print(f"  tasks with waits at most {cap:g} us before their body: {r:.1f} us", flush=True)
    if args.chain:
        lat = float(args.latency_us.split(",")[0])
        res["chain"] = c = chain_composition(schedule, dur, lat)
        print(f"the chain at {lat} us per hop: {c['chain_us']:.1f} us = {c['hops']} hops ({c['hop_us_total']:.1f} us) "
              f"+ the bodies of:")
        for k, v in c["per_kind"].items():
            print(f"  {k:34} {v['tasks']:4d} tasks {v['us']:8.1f} us (mean {v['us'] / v['tasks']:.2f})")
    if args.fold_mlp:
        extras = [float(x) for x in args.fold_mlp.split(",")]
        placed = {x: fold_mlp_schedule(schedule, dur, x) for x in extras}     # the placement has no hop latency
        res["fold_mlp"] = []
        for row in res["rows"]:
            lat, chain, sched = row["latency_us"], row["data_only_us"], row["as_scheduled_us"]
            for extra in extras:
                f = fold_mlp_chain(schedule, dur, lat, extra)
                fs, fdur = placed[extra]
                fsched, _ = longest_path(fs, None, lat, True, fdur)
                res["fold_mlp"].append({"latency_us": lat, "extra_us": extra, "chain_us": chain, "folded_us": f,
                                        "as_scheduled_us": sched, "folded_as_scheduled_us": fsched})
                print(f"hop {lat:g} us, MLP as one phase (W1/W3 +{extra:g} us): chain {chain:.1f} -> {f:.1f} us "
                      f"({(f - chain) / chain:+.0%}); as scheduled {sched:.1f} -> {fsched:.1f} us "
                      f"({(fsched - sched) / sched:+.0%})", flush=True)
    if args.placements:
        if task_us is None:
            raise SystemExit("--placements needs --task-times")
        res["placements"] = rank_placements(schedule, cfg, task_us, json.loads(args.placements),
                                            [float(x) for x in args.latency_us.split(",")])
    return res


def rank_placements(schedule, cfg, task_us, variants, latencies) -> list[dict]:
    """Re-place the same tasks (`schedule`'s tiling) per variant; replay each with the measured times."""
    import dataclasses
    per_kind = defaultdict(list)
    for t in schedule.tasks:
        per_kind[kind_key(t)].append(task_us[t.id])
    kind_means = {k: sum(x) / len(x) for k, x in per_kind.items()}
    rows = []
    print("placement | " + " | ".join(f"as scheduled at {lat:g} us" for lat in latencies))
    for v in variants:
        v = dict(v)
        measured, lat_place = v.pop("measured", False), v.pop("wait_latency_us", 0.0)
        if measured == "kind_means":    # what a compiler could know: TileConfig.kind_us from a profile
            v["kind_us"] = kind_means
        seconds = [u * 1e-6 for u in task_us] if measured is True else None
        s = build_schedule(schedule.graph, schedule.target, "parallel", dataclasses.replace(cfg, **v),
                           task_seconds=seconds, wait_latency_s=lat_place * 1e-6)
        spans = [longest_path(s, None, lat, True, task_us)[0] for lat in latencies]
        shown = {k: x for k, x in v.items() if k != "kind_us" or measured != "kind_means"}
        rows.append({"variant": {**shown, "measured": measured, "wait_latency_us": lat_place}, "as_scheduled_us": spans})
        print(f"{rows[-1]['variant']} | " + " | ".join(f"{x:.1f}" for x in spans), flush=True)
    return rows


if __name__ == "__main__":
    main()

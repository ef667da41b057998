"""Where the time goes: per-task timestamps (start, after its waits, end) recorded by a kernel
compiled with profile=True, summarised per task kind and per program, or written as a trace."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np


def kind_key(task) -> str:
    """How the summary groups tasks: the kind, and for a matvec its prologue and epilogue."""
    return task.kind_key


def timestamps(ck) -> tuple[np.ndarray, np.ndarray]:
    """(task ids, [n, 3 or 5] ns timestamps relative to the step's first start) of the last launch."""
    prof = ck.buffers.PROF.cpu().numpy()
    ids, rows = [], []
    for p, q in enumerate(ck.schedule.queues):
        for i, tid in enumerate(q):
            ids.append(tid)
            rows.append(prof[p, i])
    ts = np.array(rows, dtype=np.int64)
    return np.array(ids), np.where(ts > 0, ts - ts[:, 0].min(), 0)     # (0: a stamp this task does not record)


def summarize(ck) -> dict:
    return summarize_times(getattr(ck, "stamps_schedule", ck.schedule), *timestamps(ck))


def producers_done(schedule, ids: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """ns at which the last producer of any event each task (rows in the order of `ids`) waits on ended
    (-inf for a task without waits)."""
    at = np.zeros((len(schedule.tasks), 3))
    at[ids] = ts[:, :3]
    done = np.array([at[e.tasks, 2].max() for e in schedule.events])    # the event's last producer ended
    return np.array([max((done[g] for g, _ in schedule.tasks[tid].waits), default=-np.inf) for tid in ids])


def wait_split(schedule, ids: np.ndarray, ts: np.ndarray, ready: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each task's wait (start to after-waits, us) in two parts, rows in the order of `ids`:
    blocked = how long after its start the last producer it waits on ended (the data was not there);
    notify = from then (or its start) to the end of its waits (the publish reaching the acquire).
    A task without waits has 0 blocked; its whole wait segment (table reads) counts as notify.
    ready: producers_done's answer, where the caller has it."""
    if ready is None:
        ready = producers_done(schedule, ids, ts)
    start, after = ts[:, 0].astype(float), ts[:, 1].astype(float)
    blocked = np.maximum(ready - start, 0.0)
    return blocked / 1e3, (after - np.maximum(start, ready)) / 1e3


def summarize_times(schedule, ids: np.ndarray, ts: np.ndarray) -> dict:
    """The summary of per-task timestamps (ids, [n, 3] ns: start, after the waits, end; queue order)."""
    tasks = schedule.tasks
    wait, body = (ts[:, 1] - ts[:, 0]) / 1e3, (ts[:, 2] - ts[:, 1]) / 1e3
    ready = producers_done(schedule, ids, ts)
    blocked, notify = wait_split(schedule, ids, ts, ready)
    span = (ts[:, 2].max() - ts[:, 0].min()) / 1e3
    kinds = defaultdict(list)
    for j, tid in enumerate(ids):
        kinds[kind_key(tasks[tid])].append(j)
    per_kind = {k: {"tasks": len(js), "wait_us_mean": float(wait[js].mean()), "body_us_mean": float(body[js].mean()),
                    "wait_us_total": float(wait[js].sum()), "body_us_total": float(body[js].sum()),
                    "blocked_us_mean": float(blocked[js].mean()), "notify_us_mean": float(notify[js].mean())}
                for k, js in sorted(kinds.items())}
    busy, gaps = [], []
    start = 0
    for q in schedule.queues:
        n = len(q)
        if n:
            seg = ts[start:start + n]
            busy.append(float((seg[:, 2] - seg[:, 1]).sum() / 1e3 / span))
            gaps.append(float(np.maximum(seg[1:, 0] - seg[:-1, 2], 0).sum() / 1e3) if n > 1 else 0.0)
        start += n
    if ts.shape[1] >= 5:    # profile="detail": where a body's time goes (matvecs, the final norm and the
        for k, js in kinds.items():     # argmax record all three: their first operands, then the rest)
            js = np.array(js)
            js = js[(ts[js, 3] > 0) & (ts[js, 4] > 0)]     # (inside a matvec run only the last task has 4)
            if len(js):
                # the final norm also stamps its second load (column 5; a profile without it has 5
                # columns): compute then counts from there
                second = ts.shape[1] > 5 and bool((ts[js, 5] > 0).all())
                mid = ts[js, 5] if second else ts[js, 3]
                d = {"operands": float(((ts[js, 3] - ts[js, 1]) / 1e3).mean())}     # after the waits -> loaded
                if second:
                    d["second_operands"] = float(((ts[js, 5] - ts[js, 3]) / 1e3).mean())
                d["compute"] = float(((ts[js, 4] - mid) / 1e3).mean())             # -> stores issued
                d["publish"] = float(((ts[js, 2] - ts[js, 4]) / 1e3).mean())       # barrier, fence, release
                per_kind[k]["detail_us_mean"] = d
    if ts.shape[1] >= 9:    # profile="detail": what a task's start is made of
        for k, d in start_split(ts, kinds, ready).items():
            per_kind[k]["start_us_mean"] = d
    # each kind's mean body as the placement's cost model for this model (TileConfig.kind_us; the
    # target's default table is laneformer-2b's at context 1024)
    kind_us = {k: round(v["body_us_mean"], 2) for k, v in per_kind.items()}
    return {"span_us": float(span), "tasks": len(ids), "per_kind": per_kind, "kind_us": kind_us,
            "busy_share_mean": float(np.mean(busy)), "busy_share_min": float(np.min(busy)),
            "wait_share_mean": float(wait.sum() / (span * len(busy))),
            "blocked_us_per_program": float(blocked.sum() / len(busy)),
            "notify_us_per_program": float(notify.sum() / len(busy)),
            "gap_us_per_program_mean": float(np.mean(gaps))}


def start_split(ts: np.ndarray, kinds: dict, ready: np.ndarray) -> dict:
    """Per kind (kinds: rows of ts), the mean parts of a task's start (us), from a "detail" profile
    (ready: producers_done of the same rows): `header` start -> the
    table row's header arrived; `issue` -> the wait entered (the dispatch and the loads issued before
    it); `fields` -> the wait's own table fields arrived; and over the tasks whose producers had all
    ended before those fields arrived ("ready"), `acquire` -> after the waits (the acquire loads and
    the broadcast to the program's threads). Tasks inside a matvec run after its first have no start.
    (The start's own timer may be read after the header arrived: take header + issue as one figure.)"""
    out = {}
    for k, js in kinds.items():
        js = np.array(js)
        js = js[(ts[js, 6] > 0) & (ts[js, 7] > 0) & (ts[js, 8] > 0)]
        if not len(js):
            continue
        d = {"header": float(((ts[js, 6] - ts[js, 0]) / 1e3).mean()),
             "issue": float(((ts[js, 7] - ts[js, 6]) / 1e3).mean()),
             "fields": float(((ts[js, 8] - ts[js, 7]) / 1e3).mean())}
        rj = js[ready[js] <= ts[js, 8]]
        d["ready_share"] = float(len(rj) / len(js))
        d["acquire"] = float(((ts[rj, 1] - ts[rj, 8]) / 1e3).mean()) if len(rj) else float("nan")
        out[k] = d
    return out


def format_summary(s: dict) -> str:
    lines = [f"step span {s['span_us']:.1f} us over {s['tasks']} tasks; per program: busy (after waits) "
             f"{s['busy_share_mean']:.0%} mean / {s['busy_share_min']:.0%} min, waiting {s['wait_share_mean']:.0%}, "
             f"gaps between tasks {s['gap_us_per_program_mean']:.1f} us",
             f"waiting per program: {s['blocked_us_per_program']:.0f} us blocked (a producer not done at the task's "
             f"start), {s['notify_us_per_program']:.0f} us from the producer's end to the acquire",
             f"{'kind':34} {'tasks':>7} {'wait us':>9} {'blocked':>8} {'notify':>7} {'body us':>9} {'wait total':>11} "
             f"{'body total':>11}"]
    for k, v in s["per_kind"].items():
        lines.append(f"{k:34} {v['tasks']:7d} {v['wait_us_mean']:9.2f} {v['blocked_us_mean']:8.2f} "
                     f"{v['notify_us_mean']:7.2f} {v['body_us_mean']:9.2f} {v['wait_us_total']:11.0f} "
                     f"{v['body_us_total']:11.0f}")
    detail = {k: v["detail_us_mean"] for k, v in s["per_kind"].items() if "detail_us_mean" in v}
    if detail:
        lines.append(f"{'body (detail)':34} {'operands':>9} {'2nd load':>8} {'compute':>8} {'publish':>8}   (us, mean)")
        for k, d in detail.items():
            second = f"{d['second_operands']:8.2f}" if "second_operands" in d else f"{'-':>8}"
            lines.append(f"{k:34} {d['operands']:9.2f} {second} {d['compute']:8.2f} {d['publish']:8.2f}")
        if "attention" in detail:
            lines.append("(attention: operands = the query and its first block of keys and values; 2nd load = the blocks' "
                         "softmax and products; compute = the partials' stores and, where the last split combines, "
                         "its arrival and the combine)")
    start = {k: v["start_us_mean"] for k, v in s["per_kind"].items() if "start_us_mean" in v}
    if start:
        lines.append(f"{'start (detail)':34} {'header':>9} {'issue':>8} {'fields':>8} {'acquire':>8} {'ready':>6}   "
                     "(us, mean; acquire over the ready waits)")
        for k, d in start.items():
            lines.append(f"{k:34} {d['header']:9.2f} {d['issue']:8.2f} {d['fields']:8.2f} {d['acquire']:8.2f} "
                         f"{d['ready_share']:6.0%}")
    if "kind_us" in s:
        lines.append("placement with these body times: --tile-config '" + json.dumps({"kind_us": s["kind_us"]}) + "'")
    return "\n".join(lines)

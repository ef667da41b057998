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
    """(task ids, [n, 3] ns timestamps relative to the step's first start) of the last launch."""
    prof = ck.buffers.PROF.cpu().numpy()
    ids, rows = [], []
    for p, q in enumerate(ck.schedule.queues):
        for i, tid in enumerate(q):
            ids.append(tid)
            rows.append(prof[p, i])
    ts = np.array(rows, dtype=np.int64)
    return np.array(ids), ts - ts[:, 0].min()


def summarize(ck) -> dict:
    ids, ts = timestamps(ck)
    tasks = ck.schedule.tasks
    wait, body = (ts[:, 1] - ts[:, 0]) / 1e3, (ts[:, 2] - ts[:, 1]) / 1e3
    span = (ts[:, 2].max() - ts[:, 0].min()) / 1e3
    kinds = defaultdict(list)
    for j, tid in enumerate(ids):
        kinds[kind_key(tasks[tid])].append(j)
    per_kind = {k: {"tasks": len(js), "wait_us_mean": float(wait[js].mean()), "body_us_mean": float(body[js].mean()),
                    "wait_us_total": float(wait[js].sum()), "body_us_total": float(body[js].sum())}
                for k, js in sorted(kinds.items())}
    busy, gaps = [], []
    start = 0
    for q in ck.schedule.queues:
        n = len(q)
        if n:
            seg = ts[start:start + n]
            busy.append(float((seg[:, 2] - seg[:, 1]).sum() / 1e3 / span))
            gaps.append(float(np.maximum(seg[1:, 0] - seg[:-1, 2], 0).sum() / 1e3) if n > 1 else 0.0)
        start += n
    return {"span_us": float(span), "tasks": len(ids), "per_kind": per_kind,
            "busy_share_mean": float(np.mean(busy)), "busy_share_min": float(np.min(busy)),
            "wait_share_mean": float(wait.sum() / (span * len(busy))),
            "gap_us_per_program_mean": float(np.mean(gaps))}


def format_summary(s: dict) -> str:
    lines = [f"step span {s['span_us']:.1f} us over {s['tasks']} tasks; per program: busy (after waits) "
             f"{s['busy_share_mean']:.0%} mean / {s['busy_share_min']:.0%} min, waiting {s['wait_share_mean']:.0%}, "
             f"gaps between tasks {s['gap_us_per_program_mean']:.1f} us",
             f"{'kind':34} {'tasks':>7} {'wait us':>9} {'body us':>9} {'wait total':>11} {'body total':>11}"]
    for k, v in s["per_kind"].items():
        lines.append(f"{k:34} {v['tasks']:7d} {v['wait_us_mean']:9.2f} {v['body_us_mean']:9.2f} "
                     f"{v['wait_us_total']:11.0f} {v['body_us_total']:11.0f}")
    return "\n".join(lines)


def chrome_trace(ck, path: str) -> None:
    """A Chrome/Perfetto trace: one row per program, a slice per wait and per body."""
    ids, ts = timestamps(ck)
    prog = {tid: p for p, q in enumerate(ck.schedule.queues) for tid in q}
    events = []
    for j, tid in enumerate(ids):
        t = ck.schedule.tasks[tid]
        name = f"{t.kind} {t.op} l{t.lane}"
        events.append({"name": "wait " + name, "ph": "X", "pid": 0, "tid": prog[tid], "ts": ts[j, 0] / 1e3,
                       "dur": (ts[j, 1] - ts[j, 0]) / 1e3})
        events.append({"name": name, "ph": "X", "pid": 0, "tid": prog[tid], "ts": ts[j, 1] / 1e3,
                       "dur": (ts[j, 2] - ts[j, 1]) / 1e3})
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)

"""A profiled step: the task-times file (`kogc bench --profile --task-times FILE`, read with
`kogc.analysis.stamps`), the schedule it belongs to, the roofline table per kind and the
Chrome/Perfetto trace."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from ..analysis.stamps import check_fits, load_stamps, schedule_for
from ..errors import KogcError
from ..runtime.profile import kind_key, summarize_times
from ..scheduler.tasks import A_WINDOW
from . import costs
from .build import Inspected, from_schedule


@dataclass
class Profile:
    path: str
    ids: np.ndarray
    ts: np.ndarray       # [tasks, >= 3] ns: start, after the waits, end (queue order)
    meta: dict
    row: np.ndarray      # task id -> its row in ids / ts

    @property
    def span_us(self) -> float:
        return float(self.ts[:, 2].max() - self.ts[:, 0].min()) / 1e3


def load_profile(path: str, ins: Inspected | None = None, kind_us: dict | None = None,
                 **schedule_args) -> tuple[Inspected, Profile]:
    """The profile at `path` and the schedule it belongs to: `ins` (a build folder: the profile must be of
    that schedule), else the one its record names (kogc.analysis.stamps.schedule_for)."""
    ids, ts, meta = load_stamps(path)
    if ins is None:
        if not meta and not schedule_args:
            raise KogcError(f"{path}: the file records no model (an older task-times file): give the build folder "
                            f"it was compiled into, kogc inspect BUILD_DIR --profile {path}")
        ins = from_schedule(schedule_for(meta, **schedule_args), path, kind_us)
    try:
        check_fits(ins.schedule, ids, path)
    except KogcError:
        s = ins.schedule
        rec = f", recorded for preset {meta.get('config')}" if meta.get("config") else ""
        raise KogcError(f"{path} is a profile of another schedule ({len(ids)} tasks{rec}): {ins.where} has "
                        f"{len(s.tasks)} tasks on {len(s.queues)} programs, or another order") from None
    row = np.empty(len(ids), dtype=np.int64)
    row[ids.astype(np.int64)] = np.arange(len(ids))
    return ins, Profile(path, ids.astype(np.int64), ts.astype(np.int64), meta, row)


def attention_bytes(t, esize: int, context: int) -> int:
    """What an attention task reads at `context` positions (K and V of its split: 2 x positions x head_dim;
    a sliding window's split of its last W)."""
    _, _, hd, ns = t.variant[:4]
    positions = min(context + 1, t.args[A_WINDOW] or context + 1)
    return 2 * math.ceil(positions / ns) * hd * esize


def task_bytes(ins: Inspected, context: int | None) -> list[int]:
    """What each task must read from memory, as the bench's floor counts it (kogc.bench.measure.
    bytes_per_token): a matvec its weight tile (its input vector is re-read by every tile, from L2), an
    attention task its split of the KV cache (at `context` positions when given, else at the cost
    model's TileConfig.cost_context), any other task its cost-model bytes (small vectors)."""
    out = []
    for t in ins.schedule.tasks:
        if t.weight is not None:
            out.append(costs.weight_bytes(ins, t))
        elif t.kind == "attention" and context:
            out.append(attention_bytes(t, ins.esize, context))
        else:
            out.append(t.cost_bytes)
    return out


def roofline(ins: Inspected, prof: Profile, bandwidth: float | None = None, context: int | None = None) -> dict:
    """Per kind: tasks, bytes, waiting and body time, the rate a program reached while streaming its
    bodies against its share of the floor (bandwidth / programs), and shares of the step's program time
    (programs x span) spent waiting, streaming (in bodies) and idle (no task). From
    kogc.runtime.profile.summarize_times, plus bytes."""
    s = ins.schedule
    summary = summarize_times(s, prof.ids, prof.ts)
    bw = bandwidth or s.target.hbm_read_bw
    P = len(s.queues)
    share = bw / P
    nbytes = task_bytes(ins, context)
    by_kind: dict[str, int] = {}
    for t in s.tasks:
        by_kind[kind_key(t)] = by_kind.get(kind_key(t), 0) + nbytes[t.id]
    total_time = P * summary["span_us"]
    rows = []
    for k, v in summary["per_kind"].items():
        b = by_kind.get(k, 0)
        body = v["body_us_total"]
        rate = b / (body * 1e-6) if body > 0 else 0.0
        rows.append({"kind": k, "tasks": v["tasks"], "bytes": b, "wait_us": v["wait_us_total"], "body_us": body,
                     "body_us_mean": v["body_us_mean"], "gbps_per_program": rate / 1e9, "of_share": rate / share,
                     "wait_share": v["wait_us_total"] / total_time, "body_share": body / total_time})
    rows.sort(key=lambda r: -r["body_us"] - r["wait_us"])
    wait = sum(r["wait_us"] for r in rows)
    body = sum(r["body_us"] for r in rows)
    total_bytes = sum(by_kind.values())
    return {"span_us": summary["span_us"], "programs": P, "bandwidth": bw, "bandwidth_given": bandwidth is not None,
            "share_gbps": share / 1e9, "bytes": total_bytes, "rows": rows,
            "wait_share": wait / total_time, "body_share": body / total_time,
            "idle_share": max(0.0, 1 - (wait + body) / total_time),
            "achieved_gbps": total_bytes / (summary["span_us"] * 1e-6) / 1e9,
            "floor_us": total_bytes / bw * 1e6, "context": context, "summary": summary}


def format_roofline(r: dict) -> str:
    src = "given by --bandwidth" if r["bandwidth_given"] else "the target's hbm_read_bw"
    ctx = (f"attention at {r['context']} positions" if r["context"]
           else "attention at the cost model's context (TileConfig.cost_context; --context N for the profile's)")
    lines = [f"roofline: the floor bandwidth {r['bandwidth'] / 1e12:.2f} TB/s ({src}), a program's share "
             f"{r['share_gbps']:.2f} GB/s over {r['programs']} programs; bytes: weight tiles, KV cache ({ctx}), "
             f"small vectors",
             f"step span {r['span_us']:.1f} us for {r['bytes'] / 1e6:.1f} MB: {r['achieved_gbps']:.0f} GB/s, the "
             f"floor {r['floor_us']:.1f} us ({r['floor_us'] / r['span_us']:.0%} of the span)",
             f"program time (programs x span): waiting {r['wait_share']:.1%}, streaming (bodies) "
             f"{r['body_share']:.1%}, "
             f"idle (no task) {r['idle_share']:.1%}",
             f"{'kind':30} {'tasks':>7} {'MB':>8} {'wait us':>10} {'body us':>10} {'body mean':>9} "
             f"{'GB/s/prog':>9} {'of share':>8} {'waiting':>7} {'streaming':>9}"]
    for x in r["rows"]:
        lines.append(f"{x['kind']:30} {x['tasks']:7d} {x['bytes'] / 1e6:8.2f} {x['wait_us']:10.0f} "
                     f"{x['body_us']:10.0f} {x['body_us_mean']:9.2f} {x['gbps_per_program']:9.2f} "
                     f"{x['of_share']:8.0%} {x['wait_share']:7.1%} {x['body_share']:9.1%}")
    return "\n".join(lines)


def task_name(t) -> str:
    return f"{kind_key(t)} {t.op} l{t.lane}"


def trace_events(ins: Inspected, prof: Profile, programs: range | None = None,
                 window: tuple[float, float] | None = None) -> dict:
    """A Chrome/Perfetto trace: one track (tid) per program, named; per task a complete event ("ph": "X")
    for its wait and one for its body (us), with the task's id, layer and waits."""
    return schedule_trace(ins.schedule, prof.ts, prof.row, programs, window)


def chrome_trace(ck, path: str) -> None:
    """The same trace from a compiled kernel's last profiled launch (kogc.compile(..., profile=True))."""
    from ..runtime.profile import timestamps
    ids, ts = timestamps(ck)
    row = np.empty(len(ids), dtype=np.int64)
    row[ids.astype(np.int64)] = np.arange(len(ids))
    with open(path, "w") as f:
        json.dump(schedule_trace(ck.schedule, ts, row), f)


def schedule_trace(s, ts: np.ndarray, row: np.ndarray, programs: range | None = None,
                   window: tuple[float, float] | None = None) -> dict:
    """trace_events over a schedule and its stamps (ts[row[task]]: start, after the waits, end, ns)."""
    programs = programs if programs is not None else range(len(s.queues))
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "kogc step"}}]
    for p in programs:
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": p, "args": {"name": f"program {p}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": p, "args": {"sort_index": p}})
    for p in programs:
        for tid in s.queues[p]:
            a, b, c = (round(x / 1e3, 3) for x in ts[row[tid], :3].tolist())   # us, to the ns
            if window is not None and (c < window[0] or a > window[1]):
                continue
            t = s.tasks[tid]
            args = {"task": tid, "layer": t.layer, "lane": t.lane,
                    "waits": [f"{s.events[g].name}:{n}" for g, n in t.waits]}
            events.append({"name": "wait " + task_name(t), "cat": "wait", "ph": "X", "pid": 0, "tid": p, "ts": a,
                           "dur": round(b - a, 3), "args": args})
            events.append({"name": task_name(t), "cat": kind_key(t), "ph": "X", "pid": 0, "tid": p, "ts": b,
                           "dur": round(c - b, 3), "args": {"task": tid}})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_trace(ins: Inspected, prof: Profile, path: str, programs: range | None = None,
                window: tuple[float, float] | None = None) -> int:
    trace = trace_events(ins, prof, programs, window)
    try:
        with open(path, "w") as f:
            json.dump(trace, f)
    except OSError as e:
        raise KogcError(f"--trace {path}: {e.strerror}") from None
    return sum(e["ph"] == "X" for e in trace["traceEvents"])


def layer_ends(ins: Inspected, prof: Profile) -> dict[int, float]:
    """Each layer's last task's end (us): where the step's phases change."""
    out: dict[int, float] = {}
    for t in ins.schedule.tasks:
        if t.layer is not None:
            out[t.layer] = max(out.get(t.layer, 0.0), float(prof.ts[prof.row[t.id], 2]) / 1e3)
    return dict(sorted(out.items()))


def profile_kind_totals(ins: Inspected, prof: Profile) -> dict:
    """summarize_times' per-kind figures and span (for --diff)."""
    return summarize_times(ins.schedule, prof.ids, prof.ts)

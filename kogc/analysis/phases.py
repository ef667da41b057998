"""Where a lane's layer spends its time, from a profiled step's per-task stamps.

For each (lane, layer) the five phases of a layer (QKV, attention, Wo, W1/W3, W2) each span from the
previous phase's last end to their own last end; averaged over the lanes and the inner layers (the
first and last layers start and end the step), with each phase's mean body, when its last task started
its body and when its median task ended (both after the previous phase's end: a late last body with
an early median is a straggler tail, queued behind other tasks), and the bytes it reads (weights; the
KV cache at the schedule's cost context) with the time all lanes' bytes take at the read bandwidth (the
profiled run's reading where its file records one, else the target's): the floor the phase's span is held
against. Optionally the step's first layers with all lanes together, the weight bytes per 5 us over their
time (when HBM idles), and the step's tail (final norm, LM head, argmax).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..errors import KogcError
from ..runtime.profile import kind_key
from ..scheduler.fuse import GATED_KINDS

# task kind (profile.kind_key) -> the phase of a layer it belongs to
PHASE_OF = {"matvec/rmsnorm/rope_store": "QKV", "matvec/rmsnorm/rope_cache": "QKV", "matvec/rmsnorm/cache": "QKV",
            "attention": "attention", "matvec/attn_combine/residual": "Wo", "matvec/attn_combine/store": "Wo",
            "matvec/rmsnorm/store": "W1/W3",
            **{f"matvec/rmsnorm/{g}": "W1/W3" for g in GATED_KINDS},
            **{f"matvec/{g}/{e}": "W2" for g in GATED_KINDS for e in ("residual", "store")},
            "matvec/plain/residual": "W2", "matvec/plain/store": "W2", "head_norm": "QKV"}
PHASES = ("QKV", "attention", "Wo", "W1/W3", "W2")
TAIL_KINDS = ("final_norm", "matvec/plain/store_argmax", "argmax")   # the step's end


def phase_of(schedule):
    """task -> its phase (or None): by kind, a projection whose stored output a norm per head reads
    (Qwen3's q and k, `matvec/rmsnorm/store` like W1/W3) in QKV, and the attention output's projection
    in Wo whatever its prologue."""
    normed = {op.p["x"] for op in schedule.ops if op.kind == "head_norm"}
    attn = {op.node for op in schedule.ops if op.kind == "attention"}
    # the output projection reads o plainly where the last attention split combines (Wo, not W2)
    wo = {op.node for op in schedule.ops if op.kind == "matvec" and op.p.get("x") in attn}

    def phase(t):
        if t.kind == "matvec" and t.op in normed:
            return "QKV"
        return "Wo" if t.kind == "matvec" and t.op in wo else PHASE_OF.get(kind_key(t))
    return phase


def layer_phases(schedule, ids: np.ndarray, ts: np.ndarray, read_bw_Bps: float | None = None) -> list[dict]:
    """One row per phase: tasks per (lane, layer), mean span, mean body, and the last task's body start
    and the median task's end after the previous phase's last end (us; the inner layers); its bytes and
    all lanes' bytes at `read_bw_Bps` (default: the target's hbm_read_bw)."""
    rows_of = defaultdict(list)
    phase_of_task = phase_of(schedule)
    for j, tid in enumerate(ids):
        t = schedule.tasks[int(tid)]
        phase = phase_of_task(t)
        if phase is not None and t.layer is not None:
            rows_of[(t.lane, t.layer, phase)].append(j)
    layers = sorted({layer for _, layer, _ in rows_of})
    lanes = sorted({lane for lane, _, _ in rows_of})
    inner = layers[1:-1] or layers[1:]
    if not inner:
        raise KogcError("layer phases need a model of at least two layers (a layer is timed from the previous "
                        "one's end)")
    acc = {p: defaultdict(list) for p in PHASES}
    us = ts / 1e3
    for lane in lanes:
        for layer in inner:
            prev = us[rows_of[(lane, layer - 1, "W2")], 2].max()
            for p in PHASES:
                js = rows_of[(lane, layer, p)]
                if not js:
                    continue
                ends = us[js, 2]
                last = js[int(np.argmax(ends))]
                a = acc[p]
                a["tasks"].append(len(js))
                a["span"].append(ends.max() - prev)
                a["body"].append(float((us[js, 2] - us[js, 1]).mean()))
                a["last_body_start"].append(us[last, 1] - prev)
                a["median_end"].append(float(np.median(ends)) - prev)
                a["MB"].append(sum(_hbm_bytes(schedule.tasks[int(ids[j])]) for j in js) / 1e6)
                prev = ends.max()
    rows = [{"phase": p, **{k: float(np.mean(v)) for k, v in acc[p].items()}} for p in PHASES if acc[p]]
    bw = read_bw_Bps or schedule.target.hbm_read_bw
    for r in rows:     # all lanes stream at once: their bytes together at the read bandwidth
        r["floor_us"] = r["MB"] * 1e6 * len(lanes) / bw * 1e6
    return rows


def _hbm_bytes(t) -> int:
    """What a task reads from HBM: its weight tile, or attention's cache rows (its cost at the schedule's
    cost context); the activations it reads come from L2."""
    return t.weight.nbytes if t.weight is not None else t.cost_bytes if t.kind == "attention" else 0


def _spans(schedule, ids: np.ndarray, ts: np.ndarray, key_of) -> dict:
    """{key: (first start, last end) in us} over the tasks whose key_of(task) is not None."""
    span: dict = {}
    for j, tid in enumerate(ids):
        k = key_of(schedule.tasks[int(tid)])
        if k is not None:
            a = span.setdefault(k, [np.inf, -np.inf])
            a[0], a[1] = min(a[0], ts[j, 0] / 1e3), max(a[1], ts[j, 2] / 1e3)
    return {k: tuple(float(x) for x in v) for k, v in span.items()}


def first_layers(schedule, ids: np.ndarray, ts: np.ndarray, n: int = 3) -> list[dict]:
    """The step's first `n` layers, all lanes together: per (layer, phase), its first task's start and
    its last task's end, us from the step's first stamp."""
    phase_of_task = phase_of(schedule)

    def key(t):
        phase = phase_of_task(t)
        return (t.layer, phase) if phase is not None and t.layer is not None and t.layer < n else None
    span = _spans(schedule, ids, ts, key)
    return [{"layer": layer, "phase": p, "start": span[(layer, p)][0], "end": span[(layer, p)][1]}
            for layer in range(n) for p in PHASES if (layer, p) in span]


def tail_spans(schedule, ids: np.ndarray, ts: np.ndarray) -> dict[str, tuple[float, float]]:
    """The step's tail: the first start and last end (us) of the final norm, LM head and argmax tasks."""
    return _spans(schedule, ids, ts, lambda t: kind_key(t) if kind_key(t) in TAIL_KINDS else None)


def weight_rate(schedule, ids: np.ndarray, ts: np.ndarray, until_us: float, width_us: float = 5.0) -> list[float]:
    """TB/s of weight bytes per `width_us` window up to `until_us`, each task's tile counted in the
    window its body ends in (a coarse view of when HBM is busy)."""
    out = np.zeros(int(np.ceil(until_us / width_us)))
    for j, tid in enumerate(ids):
        w = schedule.tasks[int(tid)].weight
        k = int(ts[j, 2] / 1e3 // width_us)
        if w is not None and k < len(out):
            out[k] += w.nbytes
    return [float(b / (width_us * 1e-6) / 1e12) for b in out]


def phases_report(schedule, ids: np.ndarray, ts: np.ndarray, first: int = 0, read_bw_Bps: float | None = None,
                  device: str | None = None) -> dict:
    """layer_phases (with the run's bandwidth reading, if any, on `device`, the GPU it was taken on), and with
    `first` the first layers, their weight rate and the step's tail."""
    bw = read_bw_Bps or schedule.target.hbm_read_bw
    src = "the profiled run's reading" + (f" on {device}" if device else "") if read_bw_Bps else \
        f"target {schedule.target.name}'s figure"
    res = {"phases": layer_phases(schedule, ids, ts, bw), "read_bw_Bps": bw, "read_bw_from": src}
    if first:
        res["first_layers"] = rows = first_layers(schedule, ids, ts, first)
        res["weight_TBps_per_5us"] = weight_rate(schedule, ids, ts, max((r["end"] for r in rows), default=0.0))
        res["tail"] = tail_spans(schedule, ids, ts)
    return res


def format_phases(res: dict) -> str:
    rows = res["phases"]
    lines = ["| phase | tasks per lane | span us | mean body us | last body starts (us after the previous phase) "
             f"| median task ends (us after) | MB per lane | all lanes' bytes at {res['read_bw_Bps'] / 1e12:.2f} TB/s "
             f"(us; {res['read_bw_from']}) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['phase']} | {r['tasks']:.0f} | {r['span']:.1f} | {r['body']:.2f} | "
                     f"{r['last_body_start']:.1f} | {r['median_end']:.1f} | {r['MB']:.2f} | {r['floor_us']:.1f} |")
    lines.append(f"| layer | | {sum(r['span'] for r in rows):.1f} | | | | {sum(r['MB'] for r in rows):.2f} | "
                 f"{sum(r['floor_us'] for r in rows):.1f} |")
    if "first_layers" in res:
        lines += ["", "| layer | phase | first start (us) | last end (us) |", "|---|---|---|---|"]
        lines += [f"| {r['layer']} | {r['phase']} | {r['start']:.1f} | {r['end']:.1f} |" for r in res["first_layers"]]
        lines += ["", "weight TB/s per 5 us (by task end): " + " ".join(f"{x:.2f}" for x in res["weight_TBps_per_5us"])]
        lines += [f"tail: {k} from {a:.1f} to {b:.1f} us" for k, (a, b) in res["tail"].items()]
    return "\n".join(lines)

"""No GPU needed: where a lane's layer spends its time, from a profile's per-task stamps. For each
(lane, layer) the five phases of a layer (QKV, attention, Wo, W1/W3, W2) each span from the previous
phase's last end to their own last end; averaged over lanes and the inner layers, with when the
phase's last task started its body and when its median task ended (both after the previous phase's
end: a late last body with an early median is a straggler tail, queued behind other tasks).

    python scripts/layer_phases.py --task-times docs/results/2026-11-30-task-times-2b-1024-s8.npz [--preset laneformer-2b] [--tile-config JSON] [--first-layers 3]

--first-layers N adds the step's first N layers with all lanes together (the first layer's early comm
holds every lane in step) and the weight bytes per 5 us over their time: when HBM idles.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]

from kogc.runtime.profile import kind_key, load_stamps  # noqa: E402
from kogc.scheduler.tile import ESIZE  # noqa: E402

# task kind (profile.kind_key) -> the phase of a layer it belongs to
PHASE_OF = {"matvec/rmsnorm/rope_store": "QKV", "matvec/rmsnorm/rope_cache": "QKV", "matvec/rmsnorm/cache": "QKV",
            "attention": "attention", "matvec/attn_combine/residual": "Wo", "matvec/attn_combine/store": "Wo",
            "matvec/rmsnorm/store": "W1/W3", "matvec/silu_mul/residual": "W2", "matvec/silu_mul/store": "W2"}
PHASES = ("QKV", "attention", "Wo", "W1/W3", "W2")
TAIL_KINDS = ("final_norm", "matvec/plain/store_argmax", "argmax")   # the step's end


def layer_phases(schedule, ids: np.ndarray, ts: np.ndarray) -> list[dict]:
    """One row per phase: tasks per (lane, layer), mean span, mean body, and the last task's body start
    and the median task's end after the previous phase's last end (us; layers 1 .. last-1)."""
    rows_of = defaultdict(list)
    for j, tid in enumerate(ids):
        t = schedule.tasks[int(tid)]
        phase = PHASE_OF.get(kind_key(t))
        if phase is not None and t.layer is not None:
            rows_of[(t.lane, t.layer, phase)].append(j)
    layers = sorted({layer for _, layer, _ in rows_of})
    lanes = sorted({lane for lane, _, _ in rows_of})
    acc = {p: defaultdict(list) for p in PHASES}
    us = ts / 1e3
    for lane in lanes:
        for layer in layers[1:-1]:
            prev = us[rows_of[(lane, layer - 1, "W2")], 2].max()
            for p in PHASES:
                js = rows_of[(lane, layer, p)]
                ends = us[js, 2]
                last = js[int(np.argmax(ends))]
                a = acc[p]
                a["tasks"].append(len(js))
                a["span"].append(ends.max() - prev)
                a["body"].append(float((us[js, 2] - us[js, 1]).mean()))
                a["last_body_start"].append(us[last, 1] - prev)
                a["median_end"].append(float(np.median(ends)) - prev)
                prev = ends.max()
    return [{"phase": p, **{k: float(np.mean(v)) for k, v in acc[p].items()}} for p in PHASES]


def _spans(schedule, ids: np.ndarray, ts: np.ndarray, key_of) -> dict:
    """{key: (first start, last end) in us} over the tasks whose key_of(task) is not None."""
    span: dict = {}
    for j, tid in enumerate(ids):
        k = key_of(schedule.tasks[int(tid)])
        if k is not None:
            a = span.setdefault(k, [np.inf, -np.inf])
            a[0], a[1] = min(a[0], ts[j, 0] / 1e3), max(a[1], ts[j, 2] / 1e3)
    return {k: tuple(v) for k, v in span.items()}


def first_layers(schedule, ids: np.ndarray, ts: np.ndarray, n: int = 3) -> list[dict]:
    """The step's first `n` layers, all lanes together (where the early comm's all-lane barriers
    hold every lane in step): per (layer, phase), its first task's start and its last task's end, us
    from the step's first stamp."""
    def key(t):
        phase = PHASE_OF.get(kind_key(t))
        return (t.layer, phase) if phase is not None and t.layer is not None and t.layer < n else None
    span = _spans(schedule, ids, ts, key)
    return [{"layer": layer, "phase": p, "start": span[(layer, p)][0], "end": span[(layer, p)][1]}
            for layer in range(n) for p in PHASES if (layer, p) in span]


def tail_spans(schedule, ids: np.ndarray, ts: np.ndarray) -> dict[str, tuple[float, float]]:
    """The step's tail: the first start and last end (us) of the final norm, the LM head and the
    argmax tasks (by profile kind)."""
    return _spans(schedule, ids, ts, lambda t: kind_key(t) if kind_key(t) in TAIL_KINDS else None)


def weight_rate(schedule, ids: np.ndarray, ts: np.ndarray, until_us: float, width_us: float = 5.0) -> list[float]:
    """TB/s of weight bytes per `width_us` window up to `until_us`, each task's tile counted in the
    window its body ends in (a coarse view of when HBM is busy)."""
    out = np.zeros(int(np.ceil(until_us / width_us)))
    for j, tid in enumerate(ids):
        w = schedule.tasks[int(tid)].weight
        k = int(ts[j, 2] / 1e3 // width_us)
        if w is not None and k < len(out):
            out[k] += w.numel * ESIZE[schedule.dtype]
    return [float(b / (width_us * 1e-6) / 1e12) for b in out]


def main(argv=None) -> list[dict]:
    import laneformer as lf

    from kogc.frontend import to_ir
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.scheduler.tile import tile_config_from_json
    from kogc.targets import get_target
    ap = argparse.ArgumentParser()
    ap.add_argument("--task-times", required=True, help=".npz of per-task stamps (scripts/sweep.py with \"profile\": true)")
    ap.add_argument("--preset", default="laneformer-2b")
    ap.add_argument("--tile-config", help="JSON of TileConfig fields the profiled kernel was compiled with")
    ap.add_argument("--first-layers", type=int, default=0, metavar="N",
                    help="also the step's first N layers, all lanes together, and the weight rate over their time")
    args = ap.parse_args(argv)
    cfg = tile_config_from_json(args.tile_config) if args.tile_config else TileConfig()
    schedule = build_schedule(to_ir(lf.kogc_model(args.preset, seed=0)), get_target("h200"), "parallel", cfg)
    ids, ts, _ = load_stamps(args.task_times, schedule)
    rows = layer_phases(schedule, ids, ts)
    print("| phase | tasks per lane | span us | mean body us | last body starts (us after the previous "
          "phase) | median task ends (us after) |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} | {r['tasks']:.0f} | {r['span']:.1f} | {r['body']:.2f} | {r['last_body_start']:.1f} "
              f"| {r['median_end']:.1f} |")
    print(f"| layer | | {sum(r['span'] for r in rows):.1f} | | | |")
    if args.first_layers:
        first = first_layers(schedule, ids, ts, args.first_layers)
        print("\n| layer | phase | first start (us) | last end (us) |\n|---|---|---|---|")
        for r in first:
            print(f"| {r['layer']} | {r['phase']} | {r['start']:.1f} | {r['end']:.1f} |")
        rate = weight_rate(schedule, ids, ts, max(r["end"] for r in first))
        print("\nweight TB/s per 5 us (by task end): " + " ".join(f"{x:.2f}" for x in rate))
        for k, (a, b) in tail_spans(schedule, ids, ts).items():
            print(f"tail: {k} from {a:.1f} to {b:.1f} us")
    return rows


if __name__ == "__main__":
    main()

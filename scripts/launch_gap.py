"""On a GPU: where the time between two one-step launches goes (the 13-15 us by which `kogc bench`'s
per-step row trails its one-launch row). A profiled kernel records each program's entry and exit per
launch (runtime.profile.launch_stamps) beside its tasks' stamps; after launches back to back this
prints, for the last two: the previous launch's programs leaving (first, last), the next launch's
programs entering (first, last), its first task starting, its embed ending and its first layer's
first weight task starting, all in us from the previous launch's last exit. Writes $OUT/launch_gap.json.

    python scripts/launch_gap.py [--preset laneformer-2b] [--context 1024] [--launches 20]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), ROOT]

from kogc.bench.measure import write_result  # noqa: E402
from kogc.runtime.profile import launch_stamps  # noqa: E402


def gap_report(schedule, prof: np.ndarray, launches: dict[int, np.ndarray]) -> dict:
    """The last two launches' stamps, relative to the earlier one's last program exit (us)."""
    if len(launches) < 2:
        raise SystemExit("needs two launches' stamps (run at least two launches back to back)")
    e0, e1 = sorted(launches)[-2:]
    before, after = launches[e0], launches[e1]
    t0 = before[:, 1].max()
    starts, ends, first_weight, embed_end = [], [], [], []
    for p, q in enumerate(schedule.queues):
        for i, tid in enumerate(q):
            s, e = prof[p, i, 0], prof[p, i, 2]
            if s <= 0:
                continue
            starts.append(s)
            ends.append(e)
            t = schedule.tasks[tid]
            if t.kind == "embed":
                embed_end.append(e)
            if t.weight is not None and t.layer == 0:
                first_weight.append(s)

    def us(x):
        return float((x - t0) / 1e3)
    return {"epochs": [e0, e1],
            "previous_exit_first_us": us(before[:, 1].min()), "previous_exit_last_us": 0.0,
            "entry_first_us": us(after[:, 0].min()), "entry_last_us": us(after[:, 0].max()),
            "first_task_start_us": us(min(starts)), "embed_end_us": us(max(embed_end)) if embed_end else None,
            "first_layer0_weight_task_start_us": us(min(first_weight)) if first_weight else None,
            "last_task_end_us": us(max(ends)), "exit_last_us": us(after[:, 1].max())}


def main(argv=None) -> dict:
    import laneformer as lf

    import kogc
    from kogc.runtime.kernel import fill_kv_from
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="laneformer-2b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--launches", type=int, default=20)
    args = ap.parse_args(argv)
    model = lf.kogc_model(args.preset, seed=0)
    ck = kogc.compile(model, profile=True)
    fill_kv_from(ck, model)
    for i in range(args.launches):       # back to back, as `kogc bench` times them
        ck.launch(1 + i % 50, args.context + i)
    ck.raise_if_stuck()
    if ck.device.type == "cuda":
        torch.cuda.synchronize()
    rep = gap_report(ck.schedule, ck.buffers.PROF.cpu().numpy(), launch_stamps(ck))
    for k, v in rep.items():
        print(f"{k:36} {v}")
    write_result("launch_gap.json", rep)
    return rep


if __name__ == "__main__":
    main()

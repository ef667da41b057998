"""scripts/split_w2_replay.py: the what-if of W2 split over its input, placed and replayed."""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "scripts"), os.path.join(ROOT, "examples")]
import laneformer as lf  # noqa: E402
import split_w2_replay as sw  # noqa: E402

from kogc.frontend import to_ir  # noqa: E402
from kogc.runtime.profile import kind_key  # noqa: E402
from kogc.scheduler import TileConfig, build_schedule  # noqa: E402
from kogc.targets import get_target  # noqa: E402


def test_split_cuts_w1w3_events_into_slices_of_rows():
    graph, cfg = to_ir(lf.kogc_model("tiny", seed=0)), TileConfig()
    tasks1, events1 = sw.split_w2(graph, cfg, 1)
    tasks, events = sw.split_w2(graph, cfg, 2)
    assert len(tasks) == len(tasks1) and len(events) > len(events1)
    for t in tasks:
        if kind_key(t) in sw.W2_KINDS:
            assert all(need == len(events[g].tasks) for g, need in t.waits)
            # its W1/W3 producers: exactly one slice's, and none of the other slices' are left in its
            # exact producers (the check that runs after placement would call them races)
            w13 = [g for g, _ in t.waits if kind_key(tasks[events[g].tasks[0]]) == "matvec/rmsnorm/store"]
            all_w13 = {x for x in range(len(tasks)) if kind_key(tasks[x]) == "matvec/rmsnorm/store"}
            assert len(w13) == 1 and set(t.deps) & all_w13 <= set(events[w13[0]].tasks)
    # the slices of one W1/W3 event partition its producers, half of each op's rows in each
    orig = [e for e in events1 if "slice" not in e.name and any(
        kind_key(tasks1[w]) in sw.W2_KINDS for w in range(len(tasks1)) if any(g == e.id for g, _ in tasks1[w].waits))]
    e = orig[0]
    halves = [x for x in events if x.name == e.name or x.name.startswith(e.name + "/slice")]
    assert len(halves) == 2 and sorted(halves[0].tasks + halves[1].tasks) == sorted(e.tasks)
    assert abs(len(halves[0].tasks) - len(halves[1].tasks)) <= 2


def test_replay_of_the_split_runs_and_charges_the_extra(tmp_path):
    # synthetic stamps of the real placement (every task 1 us after the previous on its program, no
    # blocking), then the what-if: it replays without deadlock, and a cost per W2 task only adds time
    target, cfg = get_target("h200"), TileConfig()
    graph = to_ir(lf.kogc_model("tiny", seed=0))
    s = build_schedule(graph, target, "parallel", cfg, num_programs=target.num_programs)
    ids, rows = [], []
    for q in s.queues:
        t = 0
        for tid in q:
            rows.append([t, t + 300, t + 1300])
            ids.append(tid)
            t += 100_000             # far apart: nothing blocked
    path = tmp_path / "stamps.npz"
    np.savez(path, ids=np.array(ids), ts=np.array(rows, dtype=np.int64))
    got = sw.main(["--preset", "tiny", "--task-times", str(path), "--slices", "1,2", "--extra-us", "0,5"])
    us = {(r["slices"], r["extra_us"]): r["replay_us"] for r in got}
    assert set(us) == {(1, 0.0), (2, 0.0), (2, 5.0)}
    assert all(v > 0 for v in us.values()) and us[(2, 5.0)] > us[(2, 0.0)]

"""scripts/layer_phases.py: a lane's layer split into its five phases, from per-task stamps."""
import os
import sys

import numpy as np
from conftest import tiny

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import layer_phases as lp  # noqa: E402

from kogc.frontend import to_ir  # noqa: E402
from kogc.runtime.profile import kind_key  # noqa: E402
from kogc.scheduler import build_schedule  # noqa: E402
from kogc.scheduler.tile import ESIZE  # noqa: E402
from kogc.targets import get_target  # noqa: E402


def test_phases_add_up_to_the_layer():
    # one queue run back to back, every task 0.5 us of wait then 1 us of body: each phase's body is
    # 1 us, its task count is the schedule's, and the phases of a (lane, layer) span exactly the time
    # from the previous layer's last W2 to this layer's
    s = build_schedule(to_ir(tiny(num_lanes=2, num_hidden_layers=4)), get_target("h200"), "sequential")
    ids, rows, t = [], [], 0
    for tid in s.queues[0]:
        rows.append([t, t + 500, t + 1500])
        ids.append(tid)
        t += 1500
    ids, ts = np.array(ids), np.array(rows, dtype=np.int64)
    phases = lp.layer_phases(s, ids, ts)
    assert [r["phase"] for r in phases] == list(lp.PHASES)
    assert all(abs(r["body"] - 1.0) < 1e-9 for r in phases)
    per_lane = {p: sum(1 for t in s.tasks if t.lane == 0 and t.layer == 1 and lp.PHASE_OF.get(kind_key(t)) == p)
                for p in lp.PHASES}
    assert {r["phase"]: r["tasks"] for r in phases} == per_lane
    end = {t.id: ts[j, 2] / 1e3 for j, t in enumerate(s.tasks[i] for i in ids)}
    w2_end = {(t.lane, t.layer): max(end[u.id] for u in s.tasks if u.lane == t.lane and u.layer == t.layer
                                     and lp.PHASE_OF.get(kind_key(u)) == "W2") for t in s.tasks if t.layer is not None}
    layer_us = np.mean([w2_end[(lane, layer)] - w2_end[(lane, layer - 1)] for lane in (0, 1) for layer in (1, 2)])
    assert abs(sum(r["span"] for r in phases) - layer_us) < 1e-9


def test_first_layers_and_weight_rate():
    # the same back-to-back queue: each (layer, phase) spans its first task's start to its last task's
    # end, and the weight rate puts every tile in the window its task ends in (all bytes counted once)
    s = build_schedule(to_ir(tiny(num_lanes=2, num_hidden_layers=3)), get_target("h200"), "sequential")
    ids = np.array(s.queues[0])
    ts = np.array([[k * 1500, k * 1500 + 500, k * 1500 + 1500] for k in range(len(ids))], dtype=np.int64)
    rows = lp.first_layers(s, ids, ts, 2)
    assert {r["layer"] for r in rows} == {0, 1} and all(r["end"] > r["start"] for r in rows)
    for r in rows:
        ks = [k for k, tid in enumerate(ids) if s.tasks[tid].layer == r["layer"]
              and lp.PHASE_OF.get(kind_key(s.tasks[tid])) == r["phase"]]
        assert r["start"] == ks[0] * 1.5 and r["end"] == ks[-1] * 1.5 + 1.5
    end = len(ids) * 1.5
    rate = lp.weight_rate(s, ids, ts, end + 5, width_us=5.0)
    total = sum(t.weight.numel for t in s.tasks if t.weight) * ESIZE[s.dtype]
    assert abs(sum(x * 5e-6 * 1e12 for x in rate) - total) < 1e-3 * total


def test_tail_spans():
    s = build_schedule(to_ir(tiny(num_lanes=2, num_hidden_layers=2)), get_target("h200"), "sequential")
    ids = np.array(s.queues[0])
    ts = np.array([[k * 1000, k * 1000 + 200, k * 1000 + 1000] for k in range(len(ids))], dtype=np.int64)
    spans = lp.tail_spans(s, ids, ts)
    assert set(spans) == set(lp.TAIL_KINDS)
    where = {k: [j for j, tid in enumerate(ids) if kind_key(s.tasks[tid]) == k] for k in lp.TAIL_KINDS}
    assert all(spans[k] == (where[k][0] * 1.0, where[k][-1] * 1.0 + 1.0) for k in lp.TAIL_KINDS)

"""scripts/critical_path.py: the schedule simulator that turns measured task times into a step time."""
import os
import sys

from conftest import tiny

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import critical_path as cp  # noqa: E402

from kogc.frontend import to_ir  # noqa: E402
from kogc.scheduler import build_schedule  # noqa: E402
from kogc.targets import get_target  # noqa: E402


def _schedule(placement, **kw):
    return build_schedule(to_ir(tiny(num_lanes=2)), get_target("h200"), placement, **kw)


def test_one_queue_takes_the_sum_of_its_tasks():
    s = _schedule("sequential")
    body = {cp.kind_key(t): 1.0 for t in s.tasks}
    total, _ = cp.longest_path(s, body, 0.0, queues=True)
    assert total == len(s.tasks)
    # every wait adds the latency only where it delays a task: at most once per task
    with_latency, _ = cp.longest_path(s, body, 0.5, queues=True)
    assert len(s.tasks) <= with_latency <= len(s.tasks) * 1.5
    # measured per-task times replace the per-kind means
    per_task = [0.5 + (t.id % 3) for t in s.tasks]
    total, _ = cp.longest_path(s, body, 0.0, queues=True, task_us=per_task)
    assert total == sum(per_task)


def test_bounds_are_ordered():
    s = _schedule("parallel", num_programs=8)
    body = {cp.kind_key(t): 1.0 + 0.1 * len(cp.kind_key(t)) for t in s.tasks}
    sched, latest = cp.longest_path(s, body, 1.0, queues=True)
    chain, _ = cp.longest_path(s, body, 1.0, queues=False)
    balanced = sum(body[cp.kind_key(t)] for t in s.tasks) / len(s.queues)
    assert chain <= sched and balanced <= sched
    assert max(latest.values()) == sched
    # the chain alone: argmax comes last, after embed
    assert latest["argmax"] == max(latest.values())


def test_chain_composition_adds_up():
    # the chain's hops and per-kind bodies add up to its length, which is the data-only longest path
    s = _schedule("parallel", num_programs=8)
    dur = [1.0 + (t.id % 5) * 0.25 for t in s.tasks]
    c = cp.chain_composition(s, dur, 0.5)
    chain, _ = cp.longest_path(s, None, 0.5, queues=False, task_us=dur)
    assert abs(c["chain_us"] - chain) < 1e-9
    assert abs(c["hop_us_total"] + sum(v["us"] for v in c["per_kind"].values()) - chain) < 1e-9
    assert c["per_kind"]["embed"]["tasks"] == 1 and c["per_kind"]["argmax"]["tasks"] == 1


def test_folding_the_mlp_shortens_the_chain_by_at_most_w2():
    # W2 folded into W1/W3 at no extra cost: no longer than the chain, and no shorter than the chain
    # without W2's bodies and hops; a large extra cost on W1/W3 makes it longer than the chain
    s = _schedule("parallel", num_programs=8)
    dur = [1.0 + (t.id % 5) * 0.25 for t in s.tasks]
    assert any(cp.kind_key(t).startswith("matvec/silu_mul") for t in s.tasks)
    chain, _ = cp.longest_path(s, None, 0.5, queues=False, task_us=dur)
    folded = cp.fold_mlp_chain(s, dur, 0.5, 0.0)
    layers = tiny().config.num_hidden_layers          # the chain passes one W2 task per layer
    assert folded < chain
    assert folded >= chain - layers * (max(dur) + 0.5)
    assert cp.fold_mlp_chain(s, dur, 0.5, 100.0) > chain


def test_folded_mlp_schedule_runs_without_w2():
    # the placed what-if: no W2 task left, every wait names an event that still has producers, and
    # the replay runs to the end (its waits cannot deadlock)
    s = _schedule("parallel", num_programs=8)
    dur = [1.0] * len(s.tasks)
    fs, fdur = cp.fold_mlp_schedule(s, dur, 0.5)
    n_w2 = sum(cp.kind_key(t).startswith("matvec/silu_mul") for t in s.tasks)
    assert n_w2 and len(fs.tasks) == len(s.tasks) - n_w2 == len(fdur)
    assert not any(cp.kind_key(t).startswith("matvec/silu_mul") for t in fs.tasks)
    assert all(fs.events[g].need > 0 for t in fs.tasks for g, _ in t.waits)
    assert sorted(x for q in fs.queues for x in q) == list(range(len(fs.tasks)))
    total, _ = cp.longest_path(fs, None, 0.5, True, fdur)
    assert total >= sum(fdur) / len(fs.queues)


def test_replay_with_overheads():
    # no overheads: the in-order replay with the notify as the hop latency; overheads only delay, and
    # a program's tasks take at least the sum of their overheads and bodies
    s = _schedule("parallel", num_programs=8)
    dur = [1.0 + (t.id % 5) * 0.25 for t in s.tasks]
    plain, _ = cp.longest_path(s, None, 0.5, queues=True, task_us=dur)
    assert abs(cp.replay_with_overheads(s, dur, [0.0] * len(dur), 0.5) - plain) < 1e-9
    over = [1.5 if t.waits else 0.25 for t in s.tasks]
    slower = cp.replay_with_overheads(s, dur, over, 0.5)
    assert slower > plain
    assert slower >= max(sum(dur[t] + over[t] for t in q) for q in s.queues)


def test_measured_overheads_are_the_wait_segments_of_ready_tasks():
    # one queue, every task started after the previous one ended: nothing was blocked, so each task's
    # overhead is its group's (kind, has waits) median wait segment, here the one given to all of them
    import numpy as np
    s = _schedule("sequential")
    ids, rows, t = [], [], 0
    for tid in s.queues[0]:
        seg = 1500 if s.tasks[tid].waits else 200      # ns
        rows.append([t, t + seg, t + seg + 1000])
        ids.append(tid)
        t += seg + 1000
    over, notify = cp.measured_overheads(s, np.array(ids), np.array(rows, dtype=np.int64))
    assert all(abs(over[t.id] - (1.5 if t.waits else 0.2)) < 1e-9 for t in s.tasks)
    assert notify == 0.0

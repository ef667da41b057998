"""Scheduler soundness: real schedules pass check_schedule, broken ones are caught, random graphs never fail.

The checker (kogc.scheduler.check) is the scheduler's proof obligation: no deadlock, and every exact
producer of a task's reads happens-before it. These tests exercise it from both sides: schedules the
pipeline builds must pass it, and schedules we break on purpose (a dropped wait, a cyclic wait, a task
on no queue or on two) must fail it with a message naming the task and the wait.
"""
import copy
import dataclasses
import gc
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_queues_partition
from kogc.scheduler import SchedulerError, TileConfig, build_schedule
from kogc.scheduler import check as check_mod
from kogc.scheduler.check import check_schedule
from kogc.scheduler.deps import _union_sorted, derive
from kogc.scheduler.place import place_parallel, place_sequential
from kogc.scheduler.tasks import Region, Task
from kogc.targets import H200

CFG = TileConfig(tile_bytes=4096)


# ---------------------------------------------------------------------------------------------------
# 1. Real schedules are sound


@pytest.mark.parametrize("lanes", [1, 2, 4])
@pytest.mark.parametrize("num_programs", [1, 3, 8, 264])
def test_real_parallel_schedule_passes_check(graphs, lanes, num_programs):
    s = build_schedule(graphs(lanes), H200, "parallel", CFG, num_programs=num_programs)
    assert "check" in s.timings                 # build_schedule ran the check
    assert len(s.queues) == num_programs
    assert [t.id for t in s.tasks] == list(range(len(s.tasks)))
    assert_queues_partition(s.tasks, s.queues)
    check_schedule(s.tasks, s.events, s.queues)
    assert s.est_seconds > 0
    # Every event's producers publish to it, and every wait needs the whole event.
    for e in s.events:
        assert all(e.id in (s.tasks[tid].group, s.tasks[tid].publish_too) for tid in e.tasks)
    for t in s.tasks:
        for g, need in t.waits:
            assert need == s.events[g].need
            assert g != t.group


def test_build_tells_each_stage_as_it_ends(graphs):
    told = []
    s = build_schedule(graphs(2), H200, "parallel", CFG, num_programs=8,
                       progress=lambda stage, seconds: told.append((stage, seconds)))
    assert [stage for stage, _ in told] == ["tile", "deps", "place", "prune", "waits", "check"]
    assert dict(told) == s.timings and all(seconds >= 0 for _, seconds in told)
    assert gc.isenabled()                      # the cycle collector, paused while building, runs again


def test_a_schedule_asked_again_within_a_scope_is_the_one_built(graphs):
    """schedules_reused: the same IR, target and settings give the schedule built before, other settings
    or a fresh graph of other sizes their own; outside the scope every call builds anew."""
    from kogc.scheduler.ranks import build_rank_schedules
    from kogc.scheduler.reuse import schedules_reused
    g = graphs(2)
    with schedules_reused():
        a = build_schedule(g, H200, "parallel", CFG, num_programs=8)
        assert build_schedule(copy.deepcopy(g), H200, "parallel", CFG, num_programs=8) is a   # compared by its text
        assert build_schedule(g, H200, "parallel", CFG, num_programs=4) is not a
        assert build_schedule(g, H200, "parallel", TileConfig(tile_bytes=2048), num_programs=8) is not a
        assert build_schedule(graphs(4), H200, "parallel", CFG, num_programs=8) is not a
        ranks = build_rank_schedules(g, 2, H200, "parallel", CFG, num_programs=8)
        with schedules_reused():                # a nested scope shares the outer one's
            assert build_rank_schedules(g, 2, H200, "parallel", CFG, num_programs=8) is ranks
    assert build_schedule(g, H200, "parallel", CFG, num_programs=8) is not a
    assert build_rank_schedules(g, 2, H200, "parallel", CFG, num_programs=8) is not ranks


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_real_sequential_schedule_passes_check(graphs, lanes):
    s = build_schedule(graphs(lanes), H200, "sequential", CFG)
    assert s.queues == [[t.id for t in s.tasks]]
    check_schedule(s.tasks, s.events, s.queues)


def test_sequential_needs_no_waits(graphs):
    """One queue in task order: program order alone covers every producer, so stripping waits is sound."""
    s = build_schedule(graphs(2), H200, "sequential", CFG)
    tasks = copy.deepcopy(s.tasks)
    for t in tasks:
        t.waits = []
    check_schedule(tasks, s.events, s.queues)


# ---------------------------------------------------------------------------------------------------
# 2. Broken schedules are caught


def test_dropped_wait_is_a_race(graphs):
    s = build_schedule(graphs(2), H200, "parallel", CFG, num_programs=8)
    caught, tried = [], 0
    for t in s.tasks:
        for i in range(len(t.waits)):
            tasks = list(s.tasks)                 # (only this task changes: a shallow copy of it)
            tasks[t.id] = copy.copy(t)
            tasks[t.id].waits = list(t.waits)
            dropped = tasks[t.id].waits.pop(i)
            tried += 1
            try:
                check_schedule(tasks, s.events, s.queues)
            except SchedulerError as e:
                msg = str(e)
                assert "race" in msg, msg
                # the racing task is this one or, when later waits of its queue were pruned because
                # this one waited, a later task of the same queue
                racer = int(re.search(r"race: task (\d+) \(", msg).group(1))
                prog = next(q for q in s.queues if t.id in q)
                assert racer == t.id or (racer in prog and prog.index(racer) > prog.index(t.id)), msg
                caught.append((t.id, dropped))
    assert tried > 0
    assert caught, "no dropped wait was caught"


def test_dropped_deps_are_still_checked_by_region(graphs):
    """Dropping every wait on a multi-program schedule must be caught, whatever the deps list says."""
    s = build_schedule(graphs(1), H200, "parallel", CFG, num_programs=8)
    tasks = copy.deepcopy(s.tasks)
    for t in tasks:
        t.waits = []
    with pytest.raises(SchedulerError, match="race"):
        check_schedule(tasks, s.events, s.queues)


def _cyclic(s):
    tasks = copy.deepcopy(s.tasks)
    attn = next(t for t in tasks if t.kind == "attention")
    amax = next(t for t in reversed(tasks) if t.kind == "argmax")
    assert attn.id < amax.id
    attn.waits.append((amax.group, s.events[amax.group].need))
    return tasks, attn, amax


def test_cycle_is_a_deadlock_sequential(graphs):
    s = build_schedule(graphs(2), H200, "sequential", CFG)
    tasks, attn, amax = _cyclic(s)
    with pytest.raises(SchedulerError) as ei:
        check_schedule(tasks, s.events, s.queues)
    msg = str(ei.value)
    assert "deadlock" in msg
    assert f"stuck at task {attn.id} (" in msg
    assert f"event {amax.group} ({s.events[amax.group].name})" in msg


@pytest.mark.parametrize("num_programs", [1, 8, 264])
def test_cycle_is_a_deadlock_parallel(graphs, num_programs):
    s = build_schedule(graphs(2), H200, "parallel", CFG, num_programs=num_programs)
    tasks, attn, amax = _cyclic(s)
    with pytest.raises(SchedulerError) as ei:
        check_schedule(tasks, s.events, s.queues)
    msg = str(ei.value)
    assert "deadlock" in msg
    m = re.search(r"stuck at task (\d+) \(.*waiting on event (\d+) \(", msg)
    assert m, msg
    tid, g = int(m.group(1)), int(m.group(2))
    assert g in [w for w, _ in tasks[tid].waits]     # the named task really waits on the named event
    if num_programs == 1:
        assert (tid, g) == (attn.id, amax.group)


def test_task_on_no_queue(graphs):
    s = build_schedule(graphs(2), H200, "parallel", CFG, num_programs=8)
    queues = copy.deepcopy(s.queues)
    q = next(q for q in queues if q)
    missing = q.pop(len(q) // 2)
    with pytest.raises(SchedulerError, match=rf"task {missing} \(.*on no queue"):
        check_schedule(s.tasks, s.events, queues)


def test_task_placed_twice(graphs):
    s = build_schedule(graphs(2), H200, "parallel", CFG, num_programs=8)
    queues = copy.deepcopy(s.queues)
    src = next(p for p, q in enumerate(queues) if q)
    dup = queues[src][-1]
    queues[(src + 1) % len(queues)].append(dup)
    with pytest.raises(SchedulerError, match=rf"task {dup} \(.*placed twice"):
        check_schedule(s.tasks, s.events, queues)


def _task(tid, op, lane=-1, reads=(), writes=()):
    return Task(id=tid, variant=("matvec",), op=op, lane=lane, layer=None, args=[],
                reads=[Region(*r) for r in reads], writes=[Region(*w) for w in writes], cost_bytes=1000)


def test_derive_drops_implied_waits():
    # a -> b -> c, and c also reads a: c's wait on a is implied by its wait on b.
    tasks = [_task(0, "a", writes=[("act", 0, 8)]),
             _task(1, "b", reads=[("act", 0, 8)], writes=[("act", 8, 16)]),
             _task(2, "c", reads=[("act", 0, 4), ("act", 12, 16)], writes=[("act", 16, 20)])]
    events = derive(tasks)
    assert [e.name for e in events] == ["a", "b", "c"]
    assert tasks[2].deps == [0, 1]
    assert tasks[2].waits == [(1, 1)]
    for P in (1, 2, 3):
        check_schedule(tasks, events, [[t.id for t in tasks if t.id % P == p] for p in range(P)])


def test_derive_rejects_read_of_later_write_and_overlapping_writes():
    with pytest.raises(SchedulerError, match="task 0 .*later task 1"):
        derive([_task(0, "a", reads=[("act", 0, 4)], writes=[("act", 8, 9)]),
                _task(1, "b", writes=[("act", 2, 3)])])
    with pytest.raises(SchedulerError, match="overlapping writes in arena act"):
        derive([_task(0, "a", writes=[("act", 0, 4)]), _task(1, "b", writes=[("act", 3, 6)])])


def test_group_cycles_are_caught_as_deadlock():
    """derive groups by (op, lane); a task reading its own group's output can never have its wait met."""
    tasks = [_task(0, "a", lane=0, writes=[("act", 0, 4)]),
             _task(1, "a", lane=0, reads=[("act", 0, 4)], writes=[("act", 4, 8)])]
    events = derive(tasks)
    assert tasks[1].waits == [(0, 2)]
    with pytest.raises(SchedulerError, match=r"deadlock: .*stuck at task 1 \(a, lane 0.*event 0 \(a/lane0\)"):
        check_schedule(tasks, events, [[0, 1]])


# ---------------------------------------------------------------------------------------------------
# 3. Random task graphs: derive + place_parallel always give a sound schedule



@settings(max_examples=200, deadline=None, derandomize=True)
@given(lists=st.lists(st.lists(st.integers(0, 3000), max_size=600).map(lambda x: sorted(set(x))), max_size=6),
       repeat=st.booleans())
def test_union_of_producer_lists(lists, repeat):
    """derive's union of the regions' producers (long lists merged once, a few more inserted): the sorted
    set union, one list passed through as itself, the same list twice counted once."""
    if repeat and lists:
        lists = lists + [lists[0]]
    merged = {}
    for _ in range(2):      # the second time the long lists' union comes from `merged`
        out = _union_sorted(lists, merged)
        union = sorted(set().union(*lists))
        assert out == union and list(out) == union and len(out) == len(union)
        assert not union or out[-1] == union[-1]
        assert not set(out.own) & set(out.shared) and list(out.own) == sorted(out.own)
    if len({id(x) for x in lists}) == 1:
        assert out.shared is lists[0] and not out.own


@pytest.mark.parametrize("own", [(), (7, 300)])
def test_a_long_shared_producer_list_is_checked_as_one_requirement(own):
    """The soundness check's coverage test: a shared list of producers long enough to be checked per program
    (check.LONG_PRODUCERS) and a task's own producers beside it; each producer left uncovered is named."""
    import numpy as np
    from kogc.scheduler.tasks import Deps
    P, n = 5, 400
    prog = np.arange(n) % P
    slot = np.arange(n) // P
    shared = [d for d in range(0, 300, 2) if d not in own]
    t = Task(id=n - 1, variant=("x",), op="x", lane=0, layer=0, args=[], reads=[], writes=[],
             deps=Deps(shared, tuple(own)))
    assert len(shared) >= check_mod.LONG_PRODUCERS
    uncovered = check_mod._coverage([t], prog, slot, P)
    full = np.array([max(slot[d] for d in t.deps if prog[d] == p) + 1 for p in range(P)])
    assert uncovered(t, full) is None
    for d in [shared[0], shared[-1], *own]:
        vc = full.copy()
        vc[prog[d]] = slot[d]                    # d itself not yet known complete
        x = uncovered(t, vc)                     # d, or another producer its program has not finished either
        assert x in list(t.deps) and prog[x] == prog[d] and slot[x] >= slot[d]

@st.composite
def task_graphs(draw):
    """Tasks in blocks of one op (consecutive); each writes 1-2 fresh regions and reads sub-ranges of
    what earlier ops wrote (possibly spanning several writers and gaps nobody writes)."""
    n_tasks = draw(st.integers(1, 60))
    arenas = ("act", "f32")
    top = {a: 0 for a in arenas}
    tasks: list[Task] = []
    op_i = 0
    while len(tasks) < n_tasks:
        size = draw(st.integers(1, min(6, n_tasks - len(tasks))))
        op = f"%{op_i}.op"
        op_i += 1
        visible = dict(top)                       # what earlier ops wrote: this op must not read itself
        for _ in range(size):
            lane = draw(st.integers(-1, 3))
            reads = []
            for _ in range(draw(st.integers(0, 3))):
                arena = draw(st.sampled_from(arenas))
                if visible[arena] == 0:
                    continue
                s = draw(st.integers(0, visible[arena] - 1))
                e = draw(st.integers(s + 1, min(visible[arena], s + 40)))
                reads.append(Region(arena, s, e))
            writes = []
            for _ in range(draw(st.integers(1, 2))):
                arena = draw(st.sampled_from(arenas))
                top[arena] += draw(st.integers(0, 3))             # sometimes a gap nobody writes
                n = draw(st.integers(1, 16))
                writes.append(Region(arena, top[arena], top[arena] + n))
                top[arena] += n
            tasks.append(Task(id=len(tasks), variant=("matvec",), op=op, lane=lane, layer=None, args=[],
                              reads=reads, writes=writes, cost_bytes=draw(st.integers(0, 1 << 20))))
    return tasks


def _brute_deps(tasks, t):
    return sorted(u.id for u in tasks[:t.id] if any(r.overlaps(w) for r in t.reads for w in u.writes))


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tasks=task_graphs(), num_programs=st.integers(1, 16), bw=st.floats(1e3, 1e13),
       data=st.data())
def test_random_graphs_schedule_soundly(tasks, num_programs, bw, data):
    events = derive(tasks)

    # derive: deps are exactly the overlapping earlier writers; events partition the tasks by (op, lane).
    for t in tasks:
        assert t.deps == _brute_deps(tasks, t)
        assert all(g != t.group for g, _ in t.waits)
        assert all(need == events[g].need for g, need in t.waits)
    assert sorted(tid for e in events for tid in e.tasks) == [t.id for t in tasks]
    for e in events:
        assert len({(tasks[tid].op, tasks[tid].lane) for tid in e.tasks}) == 1

    queues, makespan = place_parallel(tasks, events, num_programs, bw)
    assert len(queues) == num_programs
    assert makespan > 0
    assert_queues_partition(tasks, queues)
    check_schedule(tasks, events, queues)

    check_schedule(tasks, events, place_sequential(tasks))

    # Any interleaving of the tasks over programs that keeps each queue in task order is also sound
    # (place_parallel's cost model only picks one of them).
    owners = data.draw(st.lists(st.integers(0, num_programs - 1), min_size=len(tasks), max_size=len(tasks)))
    shuffled = [[] for _ in range(num_programs)]
    for t, p in zip(tasks, owners):
        shuffled[p].append(t.id)
    check_schedule(tasks, events, shuffled)


@pytest.mark.skipif(not hasattr(check_mod, "prune_by_program_order"), reason="no wait pruning in this version")
@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tasks=task_graphs(), num_programs=st.integers(1, 16), bw=st.floats(1e3, 1e13))
def test_random_graphs_pruned_waits_stay_sound(tasks, num_programs, bw):
    """Dropping the waits program order already implies keeps the schedule sound, and only drops."""
    events = derive(tasks)
    queues, _ = place_parallel(tasks, events, num_programs, bw)
    before = {t.id: list(t.waits) for t in tasks}
    dropped = check_mod.prune_by_program_order(tasks, events, queues)
    assert dropped == sum(len(before[t.id]) - len(t.waits) for t in tasks)
    for t in tasks:
        assert set(t.waits) <= set(before[t.id])
        if num_programs == 1:
            assert t.waits == []            # one queue: program order implies everything
    check_schedule(tasks, events, queues)


def _replay_in_order(tasks, events, queues, secs, latency):
    """Each program runs its queue in order; a task starts when its program is free and every event
    it waits on is complete plus `latency` (the kernel's semantics). The last end."""
    from kogc.scheduler.check import run_order
    prog = {tid: p for p, q in enumerate(queues) for tid in q}
    done_at, free, end = [0.0] * len(events), [0.0] * len(queues), 0.0
    for tid in run_order(tasks, events, queues):
        t = tasks[tid]
        start = max([free[prog[tid]]] + [done_at[g] + latency for g, _ in t.waits])
        free[prog[tid]] = start + secs[tid]
        done_at[t.group] = max(done_at[t.group], free[prog[tid]])
        end = max(end, free[prog[tid]])
    return end


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tasks=task_graphs(), num_programs=st.integers(1, 16), latency=st.sampled_from([0.0, 1e-6]), data=st.data())
def test_placement_estimate_is_its_own_replay(tasks, num_programs, latency, data):
    """The placement's makespan is what its queues take when run in order with the same task times:
    no task is placed to start before its inputs are ready (a program that took work readied for a
    later time used to start it at its own, earlier, free time: estimates 30% too short at 2b)."""
    events = derive(tasks)
    secs = data.draw(st.lists(st.floats(1e-7, 1e-5), min_size=len(tasks), max_size=len(tasks)))
    queues, makespan = place_parallel(tasks, events, num_programs, 1e12, task_seconds=secs,
                                      wait_latency_s=latency)
    assert makespan == pytest.approx(_replay_in_order(tasks, events, queues, secs, latency), rel=1e-9)


def test_lane_groups_out_of_phase(graphs):
    # lane_group_stagger ranks the upper half of the lanes later: with a large offset and one program,
    # every op's lower-lane tasks are placed before its upper-lane tasks once both are ready
    s = build_schedule(graphs(4), H200, "parallel", dataclasses.replace(CFG, lane_group_stagger=1000.0),
                       num_programs=1)
    check_schedule(s.tasks, s.events, s.queues)
    pos = {tid: i for i, tid in enumerate(s.queues[0])}
    for op in {t.op for t in s.tasks if t.lane >= 0 and t.layer == 1}:
        lower = [pos[t.id] for t in s.tasks if t.op == op and t.lane < 2]
        upper = [pos[t.id] for t in s.tasks if t.op == op and t.lane >= 2]
        assert max(lower) < min(upper), op


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_merged_events_are_sound_and_fewer(graphs, lanes):
    # events waited on by exactly the same tasks share one counter (a lane's Q/K/V for its attention,
    # W1/W3 for W2); the schedule still passes the check, attention waits once
    from kogc.scheduler.deps import derive
    from kogc.scheduler.fuse import fuse
    from kogc.scheduler.tile import tile
    g = graphs(lanes)
    plain, _ = tile(g, fuse(g), CFG)
    unmerged = derive(plain)
    s = build_schedule(g, H200, "parallel", CFG, num_programs=8, prune=False)
    check_schedule(s.tasks, s.events, s.queues)
    assert len(s.events) < len(unmerged)
    assert sum(len(t.waits) for t in s.tasks) < sum(len(t.waits) for t in plain)
    assert all(len(t.waits) <= 1 for t in s.tasks if t.kind == "attention")     # (0: pruned by program order)
    for e in s.events:                     # every producer publishes to its event; needs add up
        assert all(e.id in (s.tasks[tid].group, s.tasks[tid].publish_too) for tid in e.tasks)
    assert sorted(tid for e in s.events for tid in e.tasks if s.tasks[tid].group == e.id) == list(range(len(s.tasks)))
    for t in s.tasks:
        assert all(need == s.events[g].need and g != t.group for g, need in t.waits)


@pytest.mark.parametrize("placement", ["parallel", "sequential"])
def test_waits_on_other_lanes_of_one_op_share_one_event(graphs, placement):
    # a Laneformer residual adds the other lanes' delayed terms: its task waited on one event per lane
    # of the op that wrote them; it now waits once, on that op's event over all lanes, which every
    # producer publishes to as well (the table's fifth header slot)
    from kogc.scheduler.deps import merge_events
    from kogc.scheduler.fuse import fuse
    from kogc.scheduler.schedule import HEADER
    from kogc.scheduler.tile import tile
    g = graphs(4)
    plain, _ = tile(g, fuse(g, CFG), CFG)
    before = merge_events(plain, derive(plain))
    per_lane_waits = max(sum(1 for h, _ in t.waits if before[h].name.startswith(op + "/lane")) for t in plain
                         for op in {before[h].name.split("/lane")[0] for h, _ in t.waits})
    assert per_lane_waits >= 3                       # the other 3 lanes' terms
    s = build_schedule(g, H200, placement, CFG, num_programs=8, prune=False)
    shared = [e for e in s.events if e.name.endswith("/all lanes")]
    assert shared and s.publishes_twice and s.header == HEADER + 1 + bool(s.run_variants)
    for e in shared:
        assert {s.tasks[i].lane for i in e.tasks} == {0, 1, 2, 3}
        assert all(s.tasks[i].publish_too == e.id for i in e.tasks)
    for t in s.tasks:           # no task waits on two lanes' events of one op any more
        ops = [s.events[h].name.split("/lane")[0] for h, _ in t.waits if "/lane" in s.events[h].name]
        assert len(ops) == len(set(ops))
    assert sum(len(t.waits) for t in s.tasks) < sum(len(t.waits) for t in plain)
    table, _ = s.table()
    for p, q in enumerate(s.queues):
        for i, tid in enumerate(q):
            assert table[p, i, 4] == s.tasks[tid].publish_too
    check_schedule(s.tasks, s.events, s.queues)
    # one lane: nothing to share, no slot for a second event (a run length's only where runs form)
    one = build_schedule(graphs(1), H200, placement, CFG, num_programs=8)
    assert not one.publishes_twice and one.header == HEADER + bool(one.run_variants)


def test_feeders_walk_each_shared_producer_list_once_and_find_them_all():
    """The closure over exact producers (several steps a launch need every task to feed the token) with
    producer lists shared between tasks and a few own ones added (Deps.plus): the same set as a plain walk."""
    import random
    from kogc.scheduler.check import feeders
    from kogc.scheduler.tasks import Deps
    rng = random.Random(3)
    n = 200
    shared_lists: dict[int, list[int]] = {}
    tasks = []
    for i in range(n):
        block = i // 20
        if block and block not in shared_lists:
            shared_lists[block] = sorted(rng.sample(range(block * 20 - 20, block * 20), 12))
        base = Deps(shared_lists.get(block, []))
        more = rng.sample(range(i), min(i, 2)) if i % 3 == 0 else []
        deps = base.plus(more)
        assert sorted(set(base) | set(more)) == list(deps)
        tasks.append(Task(id=i, variant=("x",), op="x", lane=0, layer=0, args=[], reads=[], writes=[], deps=deps))
    plain, work = {n - 1}, [n - 1]
    while work:
        for d in list(tasks[work.pop()].deps):
            if d not in plain:
                plain.add(d)
                work.append(d)
    assert feeders(tasks, n - 1) == plain and len(plain) > 20

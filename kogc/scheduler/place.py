"""Placement: tasks onto one queue per program of the persistent grid, with a cost model in bytes.

Event-driven list scheduling over the cost model (below): programs take ready work as they free up,
earliest tasks first. Every queue is ordered consistently with one global topological order (start
times), which is what makes the waits deadlock-free when all programs are resident.
"""
from __future__ import annotations

import heapq

from .deps import Event
from .tasks import Task

TASK_OVERHEAD_S = 0.5e-6      # table read, wait check, publish: per task, whatever its size


def bytes_model_seconds(task: Task, bytes_per_s_per_program: float) -> float:
    """The cost model's time for a task: the per-task overhead plus its bytes at a program's share."""
    return TASK_OVERHEAD_S + task.cost_bytes / bytes_per_s_per_program


def place_parallel(tasks: list[Task], events: list[Event], num_programs: int,
                   bytes_per_s_per_program: float, lane_group_stagger: float = 0.0,
                   task_seconds: list[float] | None = None,
                   wait_latency_s: float = 0.0, remote: dict[int, tuple[int, float]] | None = None,
                   dies: int = 1, die_hop_s: float = 0.0, steal_wait_s: float = 2e-6
                   ) -> tuple[list[list[int]], float]:
    """Queues for `num_programs` programs, and the estimated makespan in seconds.

    Event-driven list scheduling: when a program frees up it takes, among the tasks whose inputs are
    (estimated) ready by then, the first in task order; if none is ready it takes the one ready
    soonest. A task thus never waits behind a later-ready task of its own queue when ready work
    exists (e.g. another lane's matvec runs while attention finishes). Every task starts after its
    producers end, so sorting all tasks by start time is one global topological order consistent
    with every queue: with all programs resident, the waits cannot deadlock.

    `lane_group_stagger` ranks the upper half of the lanes this many fused ops later: two groups of
    lanes out of phase (one streams its MLP while the other's attention and Wo wait on each other).

    `task_seconds` (per task id) replaces the bytes model, e.g. with a profile's measured durations;
    `wait_latency_s` is added between a producer's end and its consumer's readiness (publish to
    acquire). `remote` (one rank of several): an event its peers' tasks complete -> (the local event
    of the task that sends the same sum from here, the hop's seconds). Every rank runs the same
    tasks, so the peers' sum is taken to arrive that long after this rank's own is sent.

    `dies` > 1 (MI300X: 8 XCDs, program p on XCD p % dies, each with its own L2): a lane's tasks have
    a home, one die (lane % dies) or, with fewer lanes than dies (a rank of several GPUs), a group of
    dies / lanes dies (all of them for one lane: no preference). A program takes the ready tasks of
    its own home (or of none: the LM head, the final norm) first, another's only when none of those
    is ready within `steal_wait_s`: a lane's chain of producers and consumers stays in one L2 where
    the balance allows. A wait whose producer ran outside the waiter's home costs `die_hop_s` more.
    A one-die GPU passes its lanes as `dies` where they get homes (kogc.scheduler.schedule.lane_homes)."""
    n = len(tasks)
    lanes = max((t.lane for t in tasks), default=-1) + 1
    homes = min(dies, lanes) if dies > 1 else 1
    home = [t.lane % homes if homes > 1 and t.lane >= 0 else -1 for t in tasks]
    stands_for: dict[int, list[tuple[int, float]]] = {}
    for r, (local, hop) in (remote or {}).items():
        stands_for.setdefault(local, []).append((r, hop))
    waiters: dict[int, list[int]] = {}
    pending = [0] * n
    for t in tasks:
        gates = {g for g, _ in t.waits}
        for g in gates:
            waiters.setdefault(g, []).append(t.id)
        pending[t.id] = len(gates)
    left_in_event = [e.need for e in events]
    event_end = [0.0] * len(events)
    ready_at = [0.0] * n
    op_rank: dict[str, int] = {}
    for t in tasks:
        op_rank.setdefault(t.op, len(op_rank))
    upper = lanes // 2
    prio = [(op_rank[t.op] + (lane_group_stagger if t.lane >= upper > 0 else 0.0), t.id) for t in tasks]
    # per home (the last: tasks of none): tasks waiting to be ready, by ready time, and ready tasks,
    # by priority
    later: list[list[tuple[float, int]]] = [[] for _ in range(homes + 1)]
    ready: list[list[tuple[float, int]]] = [[] for _ in range(homes + 1)]
    for t in tasks:
        if pending[t.id] == 0:
            later[home[t.id]].append((0.0, t.id))
    free = [(0.0, p) for p in range(num_programs)]
    queues: list[list[int]] = [[] for _ in range(num_programs)]
    makespan, placed = 0.0, 0

    def admit(until: float) -> None:
        for h in later:
            while h and h[0][0] <= until:
                tid = heapq.heappop(h)[1]
                heapq.heappush(ready[home[tid]], prio[tid])

    def soonest(heaps) -> float:
        return min((h[0][0] for h in heaps if h), default=float("inf"))

    while placed < n:
        f, p = heapq.heappop(free)
        admit(f)
        mine_at = (p % dies) * homes // dies if homes > 1 else -1      # this program's home (its die's group)
        own = (ready[mine_at], ready[-1]) if mine_at >= 0 else (ready[-1],)
        if not any(own):
            # nothing of this home ready: wait for its next task if that comes soon, else take another
            # home's ready task, else wait for the soonest of any
            t_own = soonest((later[mine_at], later[-1]) if mine_at >= 0 else (later[-1],))
            if t_own - f <= steal_wait_s or not any(ready):
                t_any = soonest(later)
                if t_own == float("inf") and t_any == float("inf") and not any(ready):
                    raise RuntimeError("placement stalled: a task waits on an event that never completes")
                admit(t_own if t_own - f <= steal_wait_s else t_any)
        mine = [h for h in own if h]
        pool = min(mine or [h for h in ready if h], key=lambda h: h[0])
        tid = heapq.heappop(pool)[1]
        t = tasks[tid]
        f = max(f, ready_at[tid])     # a task taken from the ready set may be ready later than this
                                      # program is free (when the set was filled by a program that
                                      # waited for the soonest one): it starts when it is ready
        if task_seconds is not None:
            end = f + task_seconds[tid]
        else:
            end = f + bytes_model_seconds(t, bytes_per_s_per_program)
        queues[p].append(tid)
        heapq.heappush(free, (end, p))
        placed += 1
        makespan = max(makespan, end)
        g = t.group
        event_end[g] = max(event_end[g], end)
        left_in_event[g] -= 1
        if left_in_event[g] == 0:
            for e, at in [(g, event_end[g])] + [(r, event_end[g] + hop) for r, hop in stands_for.get(g, [])]:
                for w in waiters.get(e, []):
                    far = die_hop_s if mine_at >= 0 and home[w] >= 0 and home[w] != mine_at else 0.0
                    ready_at[w] = max(ready_at[w], at + wait_latency_s + far)
                    pending[w] -= 1
                    if pending[w] == 0:
                        heapq.heappush(later[home[w]], (ready_at[w], w))
    return queues, makespan


def die_edge_share(tasks: list[Task], queues: list[list[int]], dies: int) -> float:
    """The share of dependency edges (a task and each exact producer) whose two tasks run on programs of
    the same die (program p on die p % dies): what stays in one L2 on a chiplet GPU."""
    die = {}
    for p, q in enumerate(queues):
        for tid in q:
            die[tid] = p % dies
    same = total = 0
    for t in tasks:
        for d in t.deps:
            total += 1
            same += die[d] == die[t.id]
    return same / total if total else 1.0


def place_sequential(tasks: list[Task]) -> list[list[int]]:
    """One queue in task order: valid when programs run one after another (Triton's interpreter)."""
    return [[t.id for t in tasks]]

"""Prove a schedule sound before any code is generated, by simulating it.

1. No deadlock: run every queue honouring its waits on the event counters; if all queues stall
   before the end, name a stuck task and the wait it cannot get past.
2. Every read after its write: vector clocks follow what each program may assume complete
   (its own earlier tasks, and what an acquired event's producers knew when they published). A task
   whose exact producer (from region overlap) is not known complete when it starts is a race.
"""
from __future__ import annotations

import numpy as np

from .deps import Event
from .errors import SchedulerError
from .tasks import Task, parts


def check_schedule(tasks: list[Task], events: list[Event], queues: list[list[int]],
                   also: dict[int, list[int]] | None = None) -> None:
    """`also`: events a task publishes besides its own group and its `publish_too` (a send to several ranks'
    counters)."""
    _simulate(tasks, events, queues, prune=False, also=also)


def prune_by_program_order(tasks: list[Task], events: list[Event], queues: list[list[int]],
                           also: dict[int, list[int]] | None = None) -> int:
    """Drop every wait the program already knows to be satisfied when the task starts (an earlier task
    of the same queue waited on it, or on something implying it). Exact: vector clocks say which
    tasks are known complete, and knowing a task complete implies knowing all it knew. Returns the
    number of waits dropped; run `check_schedule` afterwards (build_schedule does)."""
    return _simulate(tasks, events, queues, prune=True, also=also)


def run_order(tasks: list[Task], events: list[Event], queues: list[list[int]],
              also: dict[int, list[int]] | None = None) -> list[int]:
    """Task ids in an order the queues can run them honouring their waits (e.g. to replay a schedule
    with task times: every waited event is complete before its waiter comes)."""
    order: list[int] = []
    _simulate(tasks, events, queues, prune=False, order=order, also=also)
    return order


def _simulate(tasks: list[Task], events: list[Event], queues: list[list[int]], prune: bool,
              order: list[int] | None = None, also: dict[int, list[int]] | None = None) -> int:
    also = also or {}
    P = len(queues)
    prog = np.full(len(tasks), -1, dtype=np.int64)
    slot = np.zeros(len(tasks), dtype=np.int64)
    for p, q in enumerate(queues):
        for i, tid in enumerate(q):
            if prog[tid] >= 0:
                raise SchedulerError(f"task {tid} ({tasks[tid].op}) is placed twice")
            prog[tid], slot[tid] = p, i
    if (prog < 0).any():
        tid = int(np.argmax(prog < 0))
        raise SchedulerError(f"task {tid} ({tasks[tid].op}) is on no queue")

    count = [0] * len(events)
    head = [0] * P
    vc_prog = np.zeros((P, P), dtype=np.int64)
    vc_event = np.zeros((len(events), P), dtype=np.int64)
    parked: dict[int, list[int]] = {}
    runnable = list(range(P))
    uncovered = _coverage(tasks, prog, slot, P)
    if prune:   # per event and program: how many of that queue's tasks must be done (slot + 1)
        need_vec = np.zeros((len(events), P), dtype=np.int64)
        for t in tasks:
            for g in _publishes(t, also):
                need_vec[g, prog[t.id]] = max(need_vec[g, prog[t.id]], slot[t.id] + 1)
    dropped = 0
    while runnable:
        p = runnable.pop()
        q = queues[p]
        vc = vc_prog[p]         # the program's clock, advanced in place task by task
        while head[p] < len(q):
            t = tasks[q[head[p]]]
            blocked = None
            for g, n in t.waits:
                if count[g] < n:
                    blocked = g
                    break
            if blocked is not None:
                parked.setdefault(blocked, []).append(p)
                break
            known = vc
            if t.may_skip_waits:        # its reads need its waits; what they tell its program does not keep
                known = vc.copy()
            if prune:
                kept = []
                for g, n in t.waits:
                    if (need_vec[g] <= known).all():
                        dropped += 1
                    else:
                        kept.append((g, n))
                        np.maximum(known, vc_event[g], out=known)
                t.waits = kept
            else:
                for g, _ in t.waits:
                    np.maximum(known, vc_event[g], out=known)
            bad = uncovered(t, known)
            if bad is not None:
                raise SchedulerError(
                        f"race: task {t.id} ({t.op}, lane {t.lane}) on program {p} reads what task {bad} "
                        f"({tasks[bad].op}, lane {tasks[bad].lane}) on program {prog[bad]} writes, but no wait "
                        f"orders them (waits: {[events[g].name for g, _ in t.waits]})")
            vc[p] = head[p] + 1
            head[p] += 1
            if order is not None:
                order.append(t.id)
            for g in _publishes(t, also):
                np.maximum(vc_event[g], vc, out=vc_event[g])
                count[g] += 1
                if count[g] == events[g].need:
                    runnable.extend(parked.pop(g, []))
    stuck = [p for p in range(P) if head[p] < len(queues[p])]
    if stuck:
        p = stuck[0]
        t = tasks[queues[p][head[p]]]
        where = f"program {p} is stuck at task {t.id} ({t.op}, lane {t.lane}, queue slot {head[p]})"
        g, n = next((g, n) for g, n in t.waits if count[g] < n)
        raise SchedulerError(f"deadlock: {where} waiting on event {g} ({events[g].name}) for {n} tasks, only "
                             f"{count[g]} can ever finish; {len(stuck)} programs stuck")
    return dropped


LONG_PRODUCERS = 64   # a shared producer list this long is checked as one requirement per program


def _coverage(tasks: list[Task], prog: np.ndarray, slot: np.ndarray, P: int):
    """uncovered(task, vc): a producer of the task that the vector clock vc (per program, how many of its
    tasks are known complete) does not cover, or None. A long shared list of producers (Deps.shared) is
    turned once into what it needs of each program, the slot + 1 of its last producer there; the rest of
    a task's producers are checked one by one. Tasks that read alike share both."""
    need_of: dict[int, np.ndarray | None] = {}
    few_of: dict[int, np.ndarray] = {}

    def uncovered(t: Task, vc: np.ndarray) -> int | None:
        shared, own = parts(t.deps)
        need = need_of.get(id(shared), False)
        if need is False:
            need = None
            if len(shared) >= LONG_PRODUCERS:
                ids = np.asarray(shared, dtype=np.int64)
                need = np.zeros(P, dtype=np.int64)
                np.maximum.at(need, prog[ids], slot[ids] + 1)
            need_of[id(shared)] = need
        if need is not None and not (vc >= need).all():
            return next(d for d in shared if vc[prog[d]] <= slot[d])
        few = few_of.get(id(t.deps))
        if few is None:
            few = few_of[id(t.deps)] = np.asarray(list(own) if need is not None else list(t.deps), dtype=np.int64)
        if few.size:
            ok = vc[prog[few]] > slot[few]
            if not ok.all():
                return int(few[np.argmin(ok)])
        return None
    return uncovered


def _publishes(t: Task, also: dict[int, list[int]]) -> tuple[int, ...]:
    """The events task t counts on: its group, a shared lane event (kogc.scheduler.deps), and `also`'s."""
    return t.published + tuple(also.get(t.id, ()))


def feeders(tasks: list[Task], start: int) -> set[int]:
    """The ids of `start` and of every task it depends on through the exact producers. A shared list of
    producers (Deps.shared) is walked once, however many tasks hold it."""
    seen, walked = {start}, set()
    work = [start]
    while work:
        shared, own = parts(tasks[work.pop()].deps)
        if id(shared) in walked:
            shared = ()
        else:
            walked.add(id(shared))
        for ids in (shared, own):
            for d in ids:
                if d not in seen:
                    seen.add(d)
                    work.append(d)
    return seen


def check_step_closure(schedule) -> None:
    """Several steps in one launch reuse every buffer; that is safe only if every task of a step
    happens before the step's token is sampled (programs wait for the token between steps). Prove
    that every task feeds the sampling task, or name one that does not."""
    tasks = schedule.tasks
    sample = next((t.id for t in tasks if t.kind == "argmax"), None)
    if sample is None:
        raise SchedulerError("the model produces no token (no argmax): it cannot generate in one launch")
    seen = feeders(tasks, sample)
    if len(seen) != len(tasks):
        t = next(t for t in tasks if t.id not in seen)
        raise SchedulerError(f"task {t.id} ({t.op}, lane {t.lane}) does not feed the sampled token: a later step "
                             f"could overwrite its buffers while it runs")

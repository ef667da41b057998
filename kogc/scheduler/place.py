"""Placement: tasks onto one queue per program of the persistent grid, with a cost model in bytes.

List scheduling in task order (a topological order): each task goes to the program that frees up
first, starting when its inputs are estimated ready. Every queue is then ordered consistently with
one global topological order, which is what makes the waits deadlock-free when all programs are
resident (the globally first unfinished task always has its inputs done).
"""
from __future__ import annotations

import heapq

from .deps import Event
from .tasks import Task

TASK_OVERHEAD_S = 0.5e-6      # table read, wait check, publish: per task, whatever its size


def place_parallel(tasks: list[Task], events: list[Event], num_programs: int,
                   bytes_per_s_per_program: float) -> tuple[list[list[int]], float]:
    """Queues for `num_programs` programs, and the estimated makespan in seconds."""
    queues: list[list[int]] = [[] for _ in range(num_programs)]
    free = [(0.0, p) for p in range(num_programs)]
    event_done = [0.0] * len(events)
    makespan = 0.0
    for t in tasks:
        ready = max((event_done[g] for g, _ in t.waits), default=0.0)
        avail, p = heapq.heappop(free)
        end = max(avail, ready) + TASK_OVERHEAD_S + t.cost_bytes / bytes_per_s_per_program
        queues[p].append(t.id)
        heapq.heappush(free, (end, p))
        event_done[t.group] = max(event_done[t.group], end)
        makespan = max(makespan, end)
    return queues, makespan


def place_sequential(tasks: list[Task]) -> list[list[int]]:
    """One queue in task order: valid when programs run one after another (Triton's interpreter)."""
    return [[t.id for t in tasks]]

"""Where a program asks L2 for its own weights ahead of time (TileConfig.barrier_prefetch and
arrival_prefetch): points in each program's stream or queue, computed from the schedule, carried to the
kernel after the stream offsets in WOFF or as a flag in the task table."""
from __future__ import annotations

import numpy as np

BARRIER_KINDS = ("residual", "final_norm")   # tasks that wait for every lane (early comm, the final norm)
ARRIVE_FLAG = 1 << 24                        # added to the lane field (-1 or a small lane) of a task where
                                             # arrival_prefetch asks L2: flagged iff >= ARRIVE_FLAG // 2


def _waits_on(schedule, kinds) -> list[bool]:
    """Per task: does it wait directly on a task of one of these kinds?"""
    them = {t.id for t in schedule.tasks if t.kind in kinds}
    return [bool(them.intersection(t.all_deps)) for t in schedule.tasks]


def barrier_prefetch_starts(schedule) -> np.ndarray:
    """Per program: where, in its own stream (elements), the weights of its first task that waits on
    an all-lane residual start (barrier_prefetch); its stream's length if it has none."""
    behind = _waits_on(schedule, ("residual",))
    starts = []
    for q in schedule.queues:
        at, found = 0, None
        for tid in q:
            t = schedule.tasks[tid]
            if t.weight is None:
                continue
            if found is None and behind[tid]:
                found = at
            at += t.weight.numel
        starts.append(at if found is None else found)
    return np.array(starts, dtype=np.int64)


def arrival_slots(schedule) -> list[list[int]]:
    """Per program: the queue slots where a run of weighted tasks that wait on an all-lane task begins
    (arrival_prefetch; the task table flags them in their lane field, ARRIVE_FLAG)."""
    after = _waits_on(schedule, BARRIER_KINDS)
    out = []
    for q in schedule.queues:
        runs, prev = [], False
        for k, tid in enumerate(q):
            now = after[tid] and schedule.tasks[tid].weight is not None
            if now and not prev:
                runs.append(k)
            prev = now
        out.append(runs)
    return out


def prefetch_points(schedule, offsets: np.ndarray) -> list[np.ndarray]:
    """What follows the stream offsets in WOFF: with barrier_prefetch, its start per program (absolute,
    in the packed stream)."""
    if schedule.tile_config.barrier_prefetch:
        return [offsets[:-1] + barrier_prefetch_starts(schedule)]
    return []

"""Dependencies from the exact elements each task reads and writes, and the events they become.

Every task publishes to one event: its group (the tasks of one fused op for one lane). A task
waits on the groups of the tasks that wrote what it reads, needing all of each group's tasks;
waits already implied through another wait (the producer of one waited on the other) are dropped.
The resulting `Event` list is the single source of truth for the kernel's waits and publishes and
for the soundness check.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from .errors import SchedulerError
from .tasks import Task


@dataclass
class Event:
    id: int
    name: str          # e.g. "%42.matvec/lane3"
    tasks: list[int]   # its producers; the counter reaches len(tasks) per step

    @property
    def need(self) -> int:
        return len(self.tasks)


class WriteIndex:
    """Which tasks write each element range: per arena, disjoint intervals -> writer tasks."""

    def __init__(self, tasks: list[Task]):
        by_region: dict[tuple[str, int, int], list[int]] = {}
        for t in tasks:
            for r in t.writes:
                by_region.setdefault((r.arena, r.start, r.end), []).append(t.id)
        self.starts: dict[str, list[int]] = {}
        self.items: dict[str, list[tuple[int, int, list[int]]]] = {}
        for (arena, s, e), ids in sorted(by_region.items()):
            items = self.items.setdefault(arena, [])
            if items and items[-1][1] > s:
                raise SchedulerError(f"overlapping writes in arena {arena}: [{items[-1][0]}, {items[-1][1]}) by tasks "
                                     f"{items[-1][2][:3]} and [{s}, {e}) by tasks {ids[:3]}")
            items.append((s, e, ids))
            self.starts.setdefault(arena, []).append(s)

    def writers(self, arena: str, start: int, end: int) -> list[int]:
        starts, items = self.starts.get(arena, []), self.items.get(arena, [])
        out: list[int] = []
        i = max(bisect.bisect_right(starts, start) - 1, 0)
        while i < len(items) and items[i][0] < end:
            if items[i][1] > start:
                out.extend(items[i][2])
            i += 1
        return out


def derive(tasks: list[Task]) -> list[Event]:
    """Fill every task's group, deps and waits; return the events."""
    groups: dict[tuple[str, int], int] = {}
    events: list[Event] = []
    for t in tasks:
        key = (t.op, t.lane)
        if key not in groups:
            groups[key] = len(events)
            events.append(Event(len(events), f"{t.op}/lane{t.lane}" if t.lane >= 0 else t.op, []))
        t.group = groups[key]
        events[t.group].tasks.append(t.id)

    index = WriteIndex(tasks)
    ancestors = [0] * len(events)     # bitset: events complete whenever this one is
    for t in tasks:
        deps: set[int] = set()
        for r in t.reads:
            deps.update(index.writers(r.arena, r.start, r.end))
        if any(d >= t.id for d in deps):
            bad = next(d for d in deps if d >= t.id)
            raise SchedulerError(f"task {t.id} ({t.op}) reads what a later task {bad} ({tasks[bad].op}) writes")
        t.deps = sorted(deps)
        wanted = {tasks[d].group for d in deps}
        implied = 0
        for g in wanted:
            implied |= ancestors[g]
        t.waits = [(g, events[g].need) for g in sorted(wanted) if not (implied >> g) & 1]
        reach = 0
        for g in wanted:
            reach |= (1 << g) | ancestors[g]
        ancestors[t.group] |= reach
    return events

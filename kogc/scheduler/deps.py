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
from .tasks import Deps, Region, Task, parts


@dataclass
class Event:
    id: int
    name: str          # e.g. "%42.matvec/lane3"
    tasks: list[int]   # its producers; the counter reaches len(tasks) + remote per step
    remote: int = 0    # producers on other ranks (one per peer: an exchange's senders), counted here too

    @property
    def need(self) -> int:
        return len(self.tasks) + self.remote


class WriteIndex:
    """Which tasks write each element range: per arena, disjoint intervals -> writer tasks."""

    def __init__(self, tasks: list[Task]):
        by_region: dict[tuple[str, int, int], list[int]] = {}
        for t in tasks:
            for r in t.writes:
                by_region.setdefault((r.arena, r.start, r.end), []).append(t.id)
        per_arena: dict[str, list[tuple[int, int, list[int]]]] = {}
        for (arena, s, e), ids in sorted(by_region.items()):
            per_arena.setdefault(arena, []).append((s, e, ids))
        # per arena: interval starts and ends, every interval's writers in one flat list, and where
        # interval k's writers sit in it (flat[offs[k]:offs[k + 1]])
        self.arenas: dict[str, tuple[list[int], list[int], list[int], list[int]]] = {}
        for arena, items in per_arena.items():
            for (s0, e0, ids0), (s1, e1, ids1) in zip(items, items[1:]):
                if e0 > s1:
                    raise SchedulerError(f"overlapping writes in arena {arena}: [{s0}, {e0}) by tasks {ids0[:3]} "
                                         f"and [{s1}, {e1}) by tasks {ids1[:3]}")
            flat, offs = [], [0]
            for _, _, ids in items:
                flat.extend(ids)
                offs.append(len(flat))
            self.arenas[arena] = ([s for s, _, _ in items], [e for _, e, _ in items], flat, offs)

    def writers(self, arena: str, start: int, end: int) -> list[int]:
        """The tasks writing any element of [start, end): one slice of the flat list (intervals are
        disjoint and sorted, so the overlapping ones are consecutive)."""
        if arena not in self.arenas:
            return []
        starts, ends, flat, offs = self.arenas[arena]
        i = max(bisect.bisect_right(starts, start) - 1, 0)
        if ends[i] <= start:
            i += 1
        j = bisect.bisect_left(starts, end)
        return flat[offs[i]:offs[j]] if i < j else []


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
    # the tiles of one op and lane mostly read the same regions (all of h, say): derive the producers
    # once per distinct read set (the lists are shared between tasks and never mutated), and each
    # region's once (a residual's tile reads its own row's terms beside the input every tile reads)
    by_region: dict[Region, tuple[list[int], set[int]]] = {}
    by_reads: dict[tuple, tuple[list[int], list[int]]] = {}
    interned: dict[tuple, list[int]] = {}
    merged: dict[tuple, list[int]] = {}
    waits_of: dict[int, tuple[int, list[tuple[int, int]]]] = {}    # id(wanted groups) -> (implied, waits)
    for t in tasks:
        key = tuple(t.reads)
        if key not in by_reads:
            found = []
            for r in key:
                f = by_region.get(r)
                if f is None:
                    ids = sorted(set(index.writers(r.arena, r.start, r.end)))
                    ids = interned.setdefault(tuple(ids), ids)     # regions of the same writers: one list
                    f = by_region[r] = (ids, {tasks[d].group for d in ids})
                found.append(f)
            groups: set[int] = set().union(*(f[1] for f in found))
            by_reads[key] = (_union_sorted([f[0] for f in found], merged), sorted(groups))
        t.deps, wanted = by_reads[key]
        if t.deps and t.deps[-1] >= t.id:
            bad = t.deps[-1]
            raise SchedulerError(f"task {t.id} ({t.op}) reads what a later task {bad} ({tasks[bad].op}) writes")
        implied = reach = 0
        for g in wanted:
            implied |= ancestors[g]
            reach |= (1 << g) | ancestors[g]
        # tiles alike want the same groups, mostly with the same ancestors: their waits once
        known = waits_of.get(id(wanted))
        if known is None or known[0] != implied:
            known = waits_of[id(wanted)] = (implied, [(g, events[g].need) for g in wanted if not (implied >> g) & 1])
        t.waits = list(known[1])
        if not t.may_skip_waits:        # (its event then says nothing of what it waited for)
            ancestors[t.group] |= reach
    return events


def _union_sorted(lists: list[list[int]], merged: dict[tuple, list[int]]) -> Deps:
    """The sorted union of sorted, duplicate-free lists, as a Deps: the long lists' union shared (one list:
    itself; several: made once per combination, `merged`, keyed by their identities, which live as long as
    `derive`), the few producers of the short lists apart. A residual's tile reads all of its lane's MLP
    output, thousands of producers in a few long lists, beside its own row's few."""
    lists = list({id(ids): ids for ids in lists}.values())
    if len(lists) <= 1:
        return Deps(lists[0] if lists else [])
    long = [ids for ids in lists if len(ids) > 16]
    few = set().union(*(ids for ids in lists if len(ids) <= 16))
    if len(long) > 1:
        key = tuple(map(id, long))
        if key not in merged:
            merged[key] = sorted(set().union(*long))
        base = merged[key]
    else:
        base = long[0] if long else []
    if not base:
        return Deps(sorted(few))
    return Deps(base).plus(few)


def merge_events(tasks: list[Task], events: list[Event]) -> list[Event]:
    """Merge the events that exactly the same tasks wait on (a lane's Q, K and V, which only its
    attention reads; W1 and W3, which only W2 reads): one counter needing all their producers, so a
    consumer acquires once instead of once per producing op. Sound: a producer of one of them is
    never a waiter of the other (it would then wait on its own event, which derive never makes).
    Renumbers the events; fills tasks' groups and waits anew; returns the new list."""
    waiters: dict[int, list[int]] = {}
    for t in tasks:
        for g, _ in t.waits:
            waiters.setdefault(g, []).append(t.id)
    first: dict[tuple, int] = {}
    into = list(range(len(events)))
    for g in range(len(events)):
        if g in waiters:
            into[g] = first.setdefault(tuple(waiters[g]), g)
    if into == list(range(len(events))):
        return events
    new_id: dict[int, int] = {}
    merged: list[Event] = []
    for g, e in enumerate(events):
        if into[g] == g:
            new_id[g] = len(merged)
            merged.append(Event(len(merged), e.name, list(e.tasks)))
    for g, e in enumerate(events):
        if into[g] != g:
            new_id[g] = new_id[into[g]]
            m = merged[new_id[g]]
            m.tasks.extend(e.tasks)
            m.name += "+" + e.name
    for e in merged:
        e.tasks.sort()
    for t in tasks:
        t.group = new_id[t.group]
        if any(new_id[g] == t.group for g, _ in t.waits):
            raise SchedulerError(f"merging events would make task {t.id} ({t.op}) wait on its own event")
        waits: dict[int, int] = {}
        for g, _ in t.waits:
            waits[new_id[g]] = merged[new_id[g]].need
        t.waits = list(waits.items())
    return merged


def share_lane_events(tasks: list[Task], events: list[Event]) -> None:
    """A task that waits on two or more lanes' events of one op (a Laneformer residual adding the other
    lanes' delayed terms: W2 waited on 7 such events, one acquire round trip each, 3-5 us on the chain
    of laneformer-0.5b) waits instead on one event of that op over all its lanes, which every producer
    also publishes to. Only where every lane's event the task did not wait on is its ancestor (through
    the exact producers, Task.deps): the shared event then adds no dependency. Run after the pruning by
    program order, on the waits that are left: a shared event is known complete wherever the lane events
    it replaces were, so the waits pruned later stay implied. Appends those events and sets each
    producer's `publish_too` (which the soundness check and the pruning count too)."""
    ancestors = [0] * len(events)      # per event: the events complete whenever it is
    reach: dict[int, int] = {}         # per task's producers (tasks that read alike share one Deps)
    groups_of: dict[int, set[int]] = {}   # per shared list of producers: their groups
    group_of = [t.group for t in tasks]
    for t in tasks:                    # in task order: every producer comes before its consumers
        key = _key(t.deps)
        if key not in reach:
            common, own = parts(t.deps)
            gs = groups_of.get(id(common))
            if gs is None:
                gs = groups_of[id(common)] = set(map(group_of.__getitem__, common))
            r = 0
            for g in gs.union(map(group_of.__getitem__, own)):
                r |= (1 << g) | ancestors[g]
            reach[key] = r
        ancestors[t.group] |= reach[key]
    lane_events: dict[str, dict[int, int]] = {}        # an event's producing op(s) -> lane -> event
    for e in events:
        lanes = {tasks[i].lane for i in e.tasks}
        if e.remote == 0 and len(lanes) == 1 and min(lanes) >= 0:
            lane_events.setdefault(_ops_of(tasks, e), {})[min(lanes)] = e.id
    lane_events = {k: v for k, v in lane_events.items() if len(v) > 1}
    shared: dict[str, int] = {}
    for t in tasks:
        if len(t.waits) < 2:
            continue
        by_op: dict[str, list[int]] = {}
        for g, _ in t.waits:
            key = _ops_of(tasks, events[g])
            if key in lane_events and t.op not in key.split("+"):
                by_op.setdefault(key, []).append(g)
        into: dict[int, int] = {}      # a lane's event -> the shared event replacing it
        for key, gs in by_op.items():
            rest = set(lane_events[key].values()) - set(gs)
            if len(gs) < 2 or any(not (reach[_key(t.deps)] >> g) & 1 for g in rest):
                continue
            if key not in shared:
                e = Event(len(events), f"{key}/all lanes",
                          sorted(i for g in lane_events[key].values() for i in events[g].tasks))
                events.append(e)
                shared[key] = e.id
                for i in e.tasks:
                    tasks[i].publish_too = e.id
            into.update((g, shared[key]) for g in gs)
        if into:       # in the place of the first of them (waits run in order: long-complete ones first)
            kept = list(dict.fromkeys(into.get(g, g) for g, _ in t.waits))
            t.waits = [(g, events[g].need) for g in kept]


def _key(deps) -> int:
    """Tasks with the same producers share one reach: those of one shared list without own ones, by its identity."""
    shared, own = parts(deps)
    return id(deps) if own else id(shared)


def _ops_of(tasks: list[Task], e: Event) -> str:
    """The op(s) an event's producers belong to (several after merge_events), as one key."""
    return "+".join(sorted({tasks[i].op for i in e.tasks}))


def order_waits_oldest_first(tasks: list[Task], events: list[Event], senders: dict[int, list[int]] | None = None) -> None:
    """Each task's waits in the order of their last producers (task ids are a topological order), so that
    once the last producer ends only its acquire is left, not another round trip for an event complete
    long before. `senders`: for an event a rank's peers raise, the rank's own tasks that send that sum (the
    same tasks on every rank). One GPU's waits come out of `derive` in this order already; on a rank the
    waits on peers' sums had been appended after the local ones (laneformer-2b's W2 and Wo tasks paid a
    system-scope round trip after the chain's wait: rank 0 of 8 mirrored -5% in this order)."""
    last = [max(e.tasks, default=-1) for e in events]
    for g, ids in (senders or {}).items():
        last[g] = max(ids)
    for t in tasks:
        if len(t.waits) > 1:
            t.waits.sort(key=lambda w: last[w[0]])

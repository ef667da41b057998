"""Delayed tensor parallelism: one schedule per rank, linked by the sums the ranks send each other.

Each rank's graph (kogc.ir.shard) is scheduled as one GPU's is; what it receives from its peers
becomes events counted by their send tasks (`Exchange`, `Event.remote`), numbered after the rank's
own events so that the kernel acquires them at system scope. Every rank runs the same tasks (same
ids, same events), so a sender names the event in its peers' counters by its own number.

The ranks are then proven sound together: one simulation runs every rank's queues with the sends
counting on the peers' events (`check_schedule`'s `also`), which refuses a schedule that could
deadlock across ranks, or read a received sum no wait orders, naming the wait; and every task of a
rank must feed that rank's token (several steps in one launch).
"""
from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right
from collections.abc import Callable

from ..ir.graph import Graph
from ..ir.shard import shard
from ..targets import Target
from .check import check_schedule, feeders, prune_by_program_order
from .config import TileConfig, attention_splits, rank_attention, validate, with_placement
from .deps import Event, derive, merge_events, order_waits_oldest_first
from .errors import SchedulerError
from .fuse import fuse
from .place import place_sequential
from .reuse import reused
from .schedule import Schedule, Stages, place_tasks, without_cycle_collection
from .tasks import A_RECV_EVENT, Deps, Task, as_deps, parts
from .tile import tile_rank

# Placement's guess of one GPU-to-GPU put + flag (store, system-scope release, remote acquire): it only
# orders work on a rank (a sum a peer sends is taken to arrive this long after this rank's own send).
REMOTE_HOP_S = 3e-6


def build_rank_schedules(graph: Graph, ranks: int, target: Target, placement: str = "parallel",
                         tile_config: TileConfig | None = None, num_programs: int | None = None,
                         check: bool = True, prune: bool = True,
                         progress: Callable[[str, float], None] | None = None) -> list[Schedule]:
    """The schedules of ranks 0..ranks-1 for `graph` (unsharded), proven sound together. Placement
    "sequential" cuts each rank's one queue before every task that waits on a peer: the segments run
    one at a time, interleaved across ranks (the interpreter's emulation of several GPUs). progress:
    as build_schedule's, the stages named per rank, then for all ranks together."""
    def build():
        with without_cycle_collection():
            return _build_rank_schedules(graph, ranks, target, placement, tile_config, num_programs, check, prune,
                                         progress)
    return reused("ranks", graph, (ranks, target, placement, tile_config, num_programs, check, prune), build)


def _build_rank_schedules(graph, ranks, target, placement, tile_config, num_programs, check, prune,
                          progress) -> list[Schedule]:
    cfg = with_placement(attention_splits(rank_attention(validate(tile_config or TileConfig(), target), graph, ranks),
                                          graph))
    out = []
    for r in range(ranks):
        tell = None if progress is None else (lambda stage, s, r=r: progress(f"rank {r} {stage}", s))
        out.append(_rank_schedule(shard(graph, ranks, r), target, placement, cfg, num_programs, Stages(tell)))
    _check_alike(out)
    if check or prune:
        stages = Stages(progress)
        view = _Combined(out)
        if prune and placement == "parallel":
            prune_by_program_order(view.tasks, view.events, view.queues, view.also)
            view.write_back_waits(out)
            stages.done("prune (all ranks)")
        if check:
            check_schedule(view.tasks, view.events, view.queues, view.also)
            view.check_step_closure(out)
            stages.done("check (all ranks)")
        for s in out:
            s.timings.update(stages.timings)
    return out


def _rank_schedule(g: Graph, target: Target, placement: str, cfg: TileConfig, num_programs: int | None,
                   stages: Stages) -> Schedule:
    ops = fuse(g, cfg)
    tasks, layout, exchanges = tile_rank(g, ops, cfg)
    stages.done("tile")
    events = merge_events(tasks, derive(tasks))
    first_remote = len(events)
    npeer = g.meta["ranks"] - 1
    for x in exchanges:
        # after merge_events: a received sum's counter is never shared with a local one
        x.event = len(events)
        events.append(Event(x.event, f"{x.value}.recv", [], remote=npeer * len(x.sends)))
        for i in x.sends:
            tasks[i].args[A_RECV_EVENT] = x.event
    for t, xs in zip(tasks, _receivers(tasks, layout, exchanges)):
        t.waits += [(exchanges[i].event, events[exchanges[i].event].need) for i in xs]
    order_waits_oldest_first(tasks, events, {x.event: x.sends for x in exchanges})
    stages.done("deps")
    est = 0.0
    if placement == "sequential":
        queues = _segments(tasks, place_sequential(tasks)[0], first_remote)
    elif placement == "parallel":
        P = num_programs or target.num_programs
        remote = {e: (g, REMOTE_HOP_S) for e, g in send_groups(tasks, exchanges).items()}
        queues, est = place_tasks(tasks, events, target, cfg, P, remote)
    else:
        raise ValueError(f"unknown placement {placement!r} (parallel | sequential)")
    stages.done("place")
    variants = sorted({t.variant for t in tasks}, key=lambda v: [str(x) for x in v])
    return Schedule(g, target, placement, ops, tasks, events, queues, layout, cfg, variants, est, stages.timings,
                    ranks=g.meta["ranks"], rank=g.meta["rank"], exchanges=exchanges, first_remote=first_remote)


def send_groups(tasks: list[Task], exchanges) -> dict[int, int]:
    """Each received sum's event -> the event of this rank's own tasks that send that sum (a sum's send
    blocks are the tasks of one op: one event)."""
    return {x.event: tasks[x.sends[0]].group for x in exchanges}


def _receivers(tasks: list[Task], layout, exchanges) -> list[list[int]]:
    """Per task, the indices of the exchanges whose receive buffer it reads (from the regions it reads,
    not its waits: the checks must see a wait that is missing)."""
    spans = [(layout.slots[x.recv][1], layout.slots[x.recv][1] + layout.slots[x.recv][2]) for x in exchanges]
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    los, his = [spans[i][0] for i in order], [spans[i][1] for i in order]
    disjoint = all(his[k] <= los[k + 1] for k in range(len(order) - 1))
    out = []
    for t in tasks:
        f32 = [(r.start, r.end) for r in t.reads if r.arena == "f32"]
        if not f32:
            out.append([])
        elif disjoint:      # sorted and disjoint: the spans a read overlaps are one run of the order
            out.append(sorted({order[k] for a, b in f32 for k in range(bisect_right(his, a), bisect_left(los, b))}))
        else:
            out.append([i for i, (lo, hi) in enumerate(spans) if any(a < hi and lo < b for a, b in f32)])
    return out


def _segments(tasks: list[Task], order: list[int], first_remote: int) -> list[list[int]]:
    """One queue in `order`, cut before every task that waits on a peer's send."""
    out: list[list[int]] = [[]]
    for tid in order:
        if out[-1] and any(g >= first_remote for g, _ in tasks[tid].waits):
            out.append([])
        out[-1].append(tid)
    return out


def _check_alike(schedules: list[Schedule]) -> None:
    """Senders name the receive event by their own numbering: every rank must number alike."""
    first = schedules[0]
    for s in schedules[1:]:
        if len(s.tasks) != len(first.tasks) or [(x.sends, x.event) for x in s.exchanges] != \
                [(x.sends, x.event) for x in first.exchanges]:
            raise SchedulerError(f"rank {s.rank}'s tasks or exchanges differ from rank 0's: the ranks must run "
                                 f"the same tasks (a vocabulary that does not split evenly over the ranks?)")


class _Combined:
    """All ranks' tasks, events and queues as one schedule (ids offset per rank), a send counting on
    each peer's receive event: for the soundness simulation."""

    def __init__(self, schedules: list[Schedule]):
        self.toff, self.eoff, self.tasks, self.events, self.queues = [], [], [], [], []
        self.run_lengths = [lengths for s in schedules for lengths in s.run_lengths]
        for s in schedules:
            self.toff.append(len(self.tasks))
            self.eoff.append(len(self.events))
            self.tasks += [None] * len(s.tasks)
            self.events += [None] * len(s.events)
        self.also: dict[int, list[int]] = {}
        senders: dict[tuple[int, int], list[int]] = {}      # (rank, its recv event) -> global sender ids
        G = len(schedules)
        for r, s in enumerate(schedules):
            for x in s.exchanges:
                for q in range(G):
                    if q != r:
                        for i in schedules[q].exchanges[s.exchanges.index(x)].sends:
                            sender = self.toff[q] + i
                            senders.setdefault((r, x.event), []).append(sender)
                            self.also.setdefault(sender, []).append(self.eoff[r] + x.event)
        for r, s in enumerate(schedules):
            to, eo = self.toff[r], self.eoff[r]
            shifted: dict[int, list[int]] = {}      # each shared list of producers offset once per rank
            for e in s.events:
                producers = [to + t for t in e.tasks] + senders.get((r, e.id), [])
                self.events[eo + e.id] = Event(eo + e.id, f"rank{r}:{e.name}", producers)
            # the exact producers of what a task reads from a receive buffer: the peers' senders (from
            # the regions it reads, not its waits: the check must see a wait that is missing)
            for t, xs in zip(s.tasks, _receivers(s.tasks, s.layout, s.exchanges)):
                remote_deps = [d for i in xs for d in senders[(r, s.exchanges[i].event)]]
                shared, own = parts(t.deps)
                if id(shared) not in shifted:
                    shifted[id(shared)] = [to + d for d in shared]
                deps = Deps(shifted[id(shared)], tuple(to + d for d in own)).plus(remote_deps)
                self.tasks[to + t.id] = dataclasses.replace(
                    t, id=to + t.id, group=eo + t.group, waits=[(eo + g, n) for g, n in t.waits],
                    publish_too=eo + t.publish_too if t.publish_too >= 0 else -1, deps=deps, op=f"rank{r}:{t.op}")
            self.queues += [[to + t for t in q] for q in s.queues]

    def write_back_waits(self, schedules: list[Schedule]) -> None:
        for r, s in enumerate(schedules):
            for t in s.tasks:
                t.waits = [(g - self.eoff[r], n) for g, n in self.tasks[self.toff[r] + t.id].waits]

    def check_step_closure(self, schedules: list[Schedule]) -> None:
        """Every task of a rank feeds that rank's token (through its peers, for a send): then several
        steps can run in one launch on every rank. Marks each schedule proved."""
        for r, s in enumerate(schedules):
            sample = next((t.id for t in s.tasks if t.kind == "argmax"), None)
            if sample is None:
                raise SchedulerError("the model produces no token (no argmax): it cannot generate in one launch")
            seen = feeders(self.tasks, self.toff[r] + sample)
            lo = self.toff[r]
            missing = [t for t in s.tasks if lo + t.id not in seen]
            if missing:
                t = missing[0]
                raise SchedulerError(f"rank {r}: task {t.id} ({t.op}, lane {t.lane}) does not feed the rank's token: "
                                     f"a later step could overwrite its buffers while it runs")
            s.__dict__["_step_closed"] = True      # Schedule.check_step_closure's cached proof


def mirrored(s: Schedule) -> Schedule:
    """Rank `s` as it runs alone on one GPU with every peer mirrored by the rank itself
    (kogc.runtime.ranks.mirror_rank): its own send of each sum stands for all G - 1 peers' sends, storing
    into every slot of its own receive buffer and counting G - 1 times on its own receive event, as G
    ranks in perfect step with free exchanges would. Proven here as it runs (a wait the mirror could not
    satisfy, or a read of a receive buffer that no wait orders after the send, is refused before launch,
    named). Returned as a one-GPU schedule for reading the mirror's profile (kogc analyze): each wait on
    a received sum a wait on the rank's own send of it (the send's event: `exchange_events`), and each
    reader of a receive buffer depending on that send. The kernel runs `s` itself."""
    if s.ranks < 2:
        raise SchedulerError("a mirrored rank needs a schedule of several ranks (gpus >= 2)")
    sends = {x.event: x.sends for x in s.exchanges}
    group = send_groups(s.tasks, s.exchanges)
    tasks = []
    for t, xs in zip(s.tasks, _receivers(s.tasks, s.layout, s.exchanges)):
        mine = [i for j in xs for i in s.exchanges[j].sends]
        tasks.append(dataclasses.replace(t, deps=as_deps(t.deps).plus(mine)) if mine else t)
    check_schedule(tasks, s.events, s.queues, {i: [x.event] * (s.ranks - 1) for x in s.exchanges for i in x.sends})
    for i, t in enumerate(tasks):
        if any(g in sends for g, _ in t.waits):
            tasks[i] = dataclasses.replace(t, waits=[(group[g], s.events[group[g]].need) if g in sends else (g, n)
                                                     for g, n in t.waits])
    events = [dataclasses.replace(e, tasks=list(sends[e.id]), remote=0) if e.id in sends else e for e in s.events]
    return dataclasses.replace(s, tasks=tasks, events=events)


def exchange_events(s: Schedule) -> set[int]:
    """The events of a mirrored rank (`mirrored`) that stand for sums received from peers: its sends'."""
    return set(send_groups(s.tasks, s.exchanges).values())

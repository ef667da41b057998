"""The scheduler's pipeline and its product: IR -> fused ops -> tasks -> events -> queues, checked."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..ir.graph import Graph
from ..targets import Target
from .check import check_schedule, check_step_closure, prune_by_program_order
from .config import ESIZE, TileConfig, attention_splits, validate, with_placement
from .deps import Event, derive, merge_events, order_waits_oldest_first, share_lane_events
from .fuse import FusedOp, fuse
from .place import bytes_model_seconds, die_edge_share, place_parallel, place_sequential
from .reuse import reused
from .tasks import NARGS, REMOTE_BIT, Exchange, Task
from .tile import Layout, tile

HEADER = 4          # table row: variant, lane, publish event, number of waits, [a second event it publishes
                    # to, in schedules with shared lane events: `header`]; then args, then waits


# a matvec variant runs as loops where its runs average at least this many tasks (Schedule.run_variants): with
# fewer, the loop's cost on runs of one outweighs what the runs save (laneformer-2b +2.2%, 0.5b +1.8% with every
# variant in loops)
RUN_MEAN_TASKS = 2


@dataclass
class Schedule:
    graph: Graph
    target: Target
    placement: str                  # "parallel" (all programs resident) | "sequential" (interpreter)
    ops: list[FusedOp]
    tasks: list[Task]
    events: list[Event]
    queues: list[list[int]]
    layout: Layout
    tile_config: TileConfig
    variants: list[tuple] = field(default_factory=list)
    est_seconds: float = 0.0
    timings: dict = field(default_factory=dict)
    ranks: int = 1                  # delayed tensor parallelism: this is rank `rank` of `ranks`
    rank: int = 0
    exchanges: list[Exchange] = field(default_factory=list)   # the sums this rank's peers send it
    first_remote: int | None = None  # events from here on count peers' sends (system-scope acquires)

    @property
    def num_programs(self) -> int:
        return len(self.queues)

    @property
    def dtype(self) -> str:
        return self.graph.weight_dtype

    @cached_property
    def sample_event(self) -> int:
        """The event of the task that produces the step's token (-1 if the model samples none).
        Cached: it walks every task, and launches and code generation ask for it."""
        return next((t.group for t in self.tasks if t.kind == "argmax"), -1)

    @property
    def max_pos(self) -> int | None:
        """Positions the KV cache holds (None for a model without attention)."""
        return next((op.p["max_pos"] for op in self.ops if op.kind == "attention"), None)

    @cached_property
    def published(self) -> set[int]:
        """The events some task waits on (and the sampled token's, which programs wait on between
        steps): only their producers publish. A task whose event nobody acquires skips the barrier,
        fence and counter add."""
        return {g for t in self.tasks for g, _ in t.waits} | ({self.sample_event} - {-1})

    def check_step_closure(self) -> None:
        """Prove that several steps can run in one launch (every task feeds the sampled token), or raise
        a SchedulerError naming a task that does not: kogc.scheduler.check.check_step_closure, proved
        once per schedule."""
        self._step_closed

    @cached_property
    def _step_closed(self) -> bool:
        check_step_closure(self)    # raises (and caches nothing) if a task does not feed the token
        return True

    @property
    def max_waits(self) -> int:
        return max((len(t.waits) for t in self.tasks), default=0)

    @cached_property
    def publishes_twice(self) -> bool:
        """Some task also publishes to a shared lane event (kogc.scheduler.deps.share_lane_events)."""
        return any(t.publish_too in self.published for t in self.tasks)

    @property
    def header(self) -> int:
        """The table row's header: the second event's slot only where some task publishes twice, then
        the run length's slot where some matvec variant runs as loops (run_variants)."""
        return HEADER + self.publishes_twice + bool(self.run_variants)

    @cached_property
    def run_variants(self) -> frozenset:
        """The matvec variants whose tasks mostly come in runs: consecutive tasks of one queue, those after
        the first without waits, publishing to the same events (W1/W3, W2 and the LM head of a one-lane
        model; a Laneformer's LM head), at least RUN_MEAN_TASKS tasks a run on average. The kernel runs
        their runs as loops (one wait, the input vector formed once, one publish); other variants stay one
        task a body, where the loop would only add its cost to runs of one."""
        tasks_of, runs_of = {}, {}
        for q, starts in zip(self.queues, self._maximal_runs):
            for i, n in starts:
                v = self.tasks[q[i]].variant
                tasks_of[v] = tasks_of.get(v, 0) + n
                runs_of[v] = runs_of.get(v, 0) + 1
        return frozenset(v for v in tasks_of if tasks_of[v] >= RUN_MEAN_TASKS * runs_of[v])

    @cached_property
    def run_lengths(self) -> list[list[int]]:
        """Per queue and slot, the run that starts there: its number of tasks for a run variant's run
        (run_variants), 1 for every other task, 0 for slots inside a run."""
        out = []
        for q, starts in zip(self.queues, self._maximal_runs):
            lengths = [1] * len(q)
            for i, n in starts:
                if n > 1 and self.tasks[q[i]].variant in self.run_variants:
                    lengths[i:i + n] = [n] + [0] * (n - 1)
            out.append(lengths)
        return out

    @cached_property
    def _maximal_runs(self) -> list[list[tuple[int, int]]]:
        """Per queue: (slot, length) of each longest run of matvec tasks, in order (a lone task: length 1)."""
        out = []
        for q in self.queues:
            starts, i = [], 0
            while i < len(q):
                n = 1
                if self.tasks[q[i]].kind == "matvec":
                    while i + n < len(q) and self._continues_run(self.tasks[q[i]], self.tasks[q[i + n]]):
                        n += 1
                starts.append((i, n))
                i += n
            out.append(starts)
        return out

    def _continues_run(self, first: Task, t: Task) -> bool:
        """Whether t can follow `first` in a run: the same variant, no waits of its own (the run waits once,
        for its first task), the same published events. Tasks that publish to one event never depend on
        one another (a task's event is not among its own waits), so no task of a run reads what another
        wrote: a run has no barrier between its tasks. The interpreter's one queue (placement
        "sequential", one rank) meets every wait by its order, as the pruned waits of "parallel" are."""
        return (t.variant == first.variant
                and (not t.waits or (self.placement == "sequential" and self.ranks == 1))
                and self._events_published(t) == self._events_published(first))

    def _events_published(self, t: Task) -> tuple[int, int]:
        """The events t's table row publishes (its op's, then its op's over all lanes), -1 for one no task
        waits on."""
        return tuple(e if e in self.published else -1 for e in (t.group, t.publish_too))

    @property
    def row_width(self) -> int:
        return self.header + NARGS + 2 * max(self.max_waits, 1)

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """The int32 task table [programs, max queue length, row] and each queue's length."""
        vid = {v: i for i, v in enumerate(self.variants)}
        P, maxlen, W = len(self.queues), max(len(q) for q in self.queues), self.row_width
        table = np.zeros((P, maxlen, W), dtype=np.int32)
        runs = self.run_lengths
        for p, q in enumerate(self.queues):
            for i, tid in enumerate(q):
                t = self.tasks[tid]
                ev, ev2 = self._events_published(t)
                row = [vid[t.variant], t.lane, ev, len(t.waits)]
                if self.publishes_twice:
                    row.append(ev2)
                if self.run_variants:
                    row.append(runs[p][i])
                row += t.args
                for g, need in t.waits:
                    row += [g if self.first_remote is None or g < self.first_remote else g + REMOTE_BIT, need]
                table[p, i, :len(row)] = row
        return table, np.array([len(q) for q in self.queues], dtype=np.int32)

    @property
    def weight_format(self) -> str:
        """How the weight stream stores matvec weights: the model's dtype, or an FP8 format (kogc.fp8)."""
        return self.target.fp8_format if self.tile_config.weights == "fp8" else self.dtype

    @property
    def weight_esize(self) -> int:
        """Bytes per element of the weight stream."""
        return 1 if self.tile_config.weights == "fp8" else ESIZE[self.dtype]

    def weight_elems_per_program(self) -> list[int]:
        """Each program's weight stream in elements (FP8: with the rows' scales)."""
        return [sum(self.tasks[t].weight.stream_elems for t in q if self.tasks[t].weight) for q in self.queues]

    def weight_bytes_per_program(self) -> list[int]:
        """What each program reads of its weight stream per step (weights and scales)."""
        return [sum(self.tasks[t].weight.nbytes for t in q if self.tasks[t].weight) for q in self.queues]

    def report(self) -> str:
        kinds = Counter(t.kind for t in self.tasks)
        qlen = [len(q) for q in self.queues]
        wbytes = self.weight_bytes_per_program()
        total = sum(wbytes)
        lines = [
            f"target {self.target.name} ({self.target.arch}), placement {self.placement}, {len(self.queues)} programs",
            f"tasks {len(self.tasks)}: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())),
            f"code variants {len(self.variants)}, events {len(self.events)}, waits per task <= {self.max_waits}, "
            f"total waits {sum(len(t.waits) for t in self.tasks)}",
            f"queue length min/mean/max {min(qlen)}/{sum(qlen) / len(qlen):.1f}/{max(qlen)}",
            f"weight bytes ({self.weight_format}) {total / 1e9:.3f} GB; per program min/mean/max "
            f"{min(wbytes) / 1e6:.2f}/{total / len(wbytes) / 1e6:.2f}/{max(wbytes) / 1e6:.2f} MB",
            "buffers: " + ", ".join(f"{a} {n}" for a, n in self.layout.sizes.items()) + " elements",
        ]
        if self.placement == "parallel" and self.target.dies > 1:
            lines.append(f"dependency edges within one die (of {self.target.dies}, program p on die p % "
                         f"{self.target.dies}): {die_edge_share(self.tasks, self.queues, self.target.dies):.1%}")
        if self.placement == "parallel" and self.target.dies == 1:
            homes = placement_homes(self.tasks, self.target, self.tile_config, len(self.queues))
            lines.append(f"lane homes: {homes} (program p takes the ready tasks of lanes l % {homes} == p % {homes} "
                         f"first)" if homes > 1 else "lane homes: none (every program takes the first ready task)")
        runs = [n for q in self.run_lengths for n in q if n > 1]
        if runs:
            lines.append(f"matvec runs (one wait, one publish a run): {len(runs)} runs of {sum(runs)} tasks, "
                         f"mean {sum(runs) / len(runs):.1f}")
        if self.placement == "parallel":
            floor = total / self.target.hbm_read_bw
            lines.append(f"cost model: {self.est_seconds * 1e3:.3f} ms per step "
                         f"({1 / self.est_seconds:.0f} tok/s); weight-read floor {floor * 1e3:.3f} ms "
                         f"at {self.target.hbm_read_bw / 1e12:.2f} TB/s")
        lines.append("stage seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in self.timings.items()))
        return "\n".join(lines)

    def to_json(self) -> str:
        variant_index = {v: i for i, v in enumerate(self.variants)}
        return json.dumps({
            "model": self.graph.meta.get("model"), "target": self.target.name, "placement": self.placement,
            "ranks": self.ranks, "rank": self.rank,
            "exchanges": [dataclasses.asdict(x) for x in self.exchanges],
            "tile_config": dataclasses.asdict(self.tile_config),     # the settings (kind_us: the placement's)
            "variants": [list(v) for v in self.variants],
            "events": [{"id": e.id, "name": e.name, "need": e.need, "remote": e.remote} for e in self.events],
            "queues": self.queues,
            "tasks": [{"id": t.id, "variant": variant_index[t.variant], "op": t.op, "lane": t.lane,
                       "layer": t.layer, "args": t.args, "publish": t.group,
                       "publish_too": t.publish_too, "waits": t.waits,
                       "weight": None if t.weight is None else [t.weight.param, t.weight.lane, t.weight.row0,
                                                                 t.weight.rows, t.weight.cols, t.weight.esize,
                                                                 t.weight.scaled, t.weight.up],
                       "cost_bytes": t.cost_bytes} for t in self.tasks],
            "layout": {k: list(v) for k, v in self.layout.slots.items()}, "sizes": self.layout.sizes,
        })


@contextlib.contextmanager
def without_cycle_collection():
    """Python's cycle collector paused: building a schedule allocates millions of small lists and tuples
    (no cycles among them), and each collection pass walked all of them again (laneformer-2b's
    dependencies: 3.2 s with it, 2.5 s without)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Stages:
    """A build's stage times (Schedule.timings), each told to `progress(stage, seconds)` as it ends: a
    large model's schedule takes most of a minute on two cores."""

    def __init__(self, progress: Callable[[str, float], None] | None = None):
        self.timings: dict[str, float] = {}
        self.progress = progress
        self.t0 = time.perf_counter()

    def done(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = now - self.t0
        self.t0 = now
        if self.progress is not None:
            self.progress(stage, self.timings[stage])


def build_schedule(graph: Graph, target: Target, placement: str = "parallel",
                   tile_config: TileConfig | None = None, num_programs: int | None = None,
                   check: bool = True, prune: bool = True,
                   progress: Callable[[str, float], None] | None = None) -> Schedule:
    """Schedule `graph` for `target`. placement="sequential" gives one queue (Triton's interpreter).
    progress(stage, seconds) is called as each stage ends (tile, deps, place, prune, waits, check)."""
    def build():
        with without_cycle_collection():
            return _build_schedule(graph, target, placement, tile_config, num_programs, check, prune,
                                   Stages(progress))
    return reused("one", graph, (target, placement, tile_config, num_programs, check, prune), build)


def _build_schedule(graph, target, placement, tile_config, num_programs, check, prune, stages: Stages) -> Schedule:
    cfg = with_placement(attention_splits(validate(tile_config or TileConfig(), target), graph))
    ops = fuse(graph, cfg)
    tasks, layout = tile(graph, ops, cfg)
    stages.done("tile")
    # one counter for events the same tasks always wait on together (a lane's Q/K/V for attention,
    # W1/W3 for W2): one acquire instead of 2-3 (measured -2%)
    events = merge_events(tasks, derive(tasks))
    stages.done("deps")
    est = 0.0
    if placement == "sequential":
        queues = place_sequential(tasks)
    elif placement == "parallel":
        P = num_programs or target.num_programs
        queues, est = place_tasks(tasks, events, target, cfg, P)
    else:
        raise ValueError(f"unknown placement {placement!r} (parallel | sequential)")
    stages.done("place")
    if prune and placement == "parallel":
        prune_by_program_order(tasks, events, queues)
        stages.done("prune")
    # on the waits left (placement orders tasks by the same dependencies either way)
    share_lane_events(tasks, events)
    order_waits_oldest_first(tasks, events)
    stages.done("waits")
    if check:
        check_schedule(tasks, events, queues)
        stages.done("check")
    variants = sorted({t.variant for t in tasks}, key=lambda v: [str(x) for x in v])
    return Schedule(graph, target, placement, ops, tasks, events, queues, layout, cfg, variants, est, stages.timings)


def placement_seconds(tasks: list[Task], cfg: TileConfig, target: Target, num_programs: int) -> list[float]:
    """Each task's time in the placement's cost model: its kind's measured time where the config has
    one (TileConfig.kind_us), else the bytes model's."""
    return kind_seconds(tasks, placement_kind_us(cfg), target.hbm_read_bw / num_programs)


STEAL_WAITS_S = (2e-6, 20e-6)    # chiplet placement: a program's wait for its home's work before taking another's


def place_tasks(tasks: list[Task], events: list[Event], target: Target, cfg: TileConfig,
                num_programs: int, remote: dict[int, tuple[int, float]] | None = None) -> tuple[list[list[int]], float]:
    """`place_parallel` with the config's cost model, lane group stagger and hop latency (`remote`: a
    rank's received sums, see place_parallel). On a chiplet target (dies > 1) it places once for each
    of STEAL_WAITS_S and keeps the queues of the lower estimated makespan: how long a program should
    wait for its home's next task depends on how busy the homes are (laneformer-2b on MI300X: one GPU's
    eight lanes, one home each, 1,234 us with 2 us against 1,364 with 6 or 20; a rank of two, four lanes
    on pairs of XCDs, 689 us with 2 us, 13% of edges in one XCD, against 634 us and 49% with 20)."""
    P = num_programs
    seconds = placement_seconds(tasks, cfg, target, P)
    homes = placement_homes(tasks, target, cfg, P)
    placed = [place_parallel(tasks, events, P, target.hbm_read_bw / P, cfg.lane_group_stagger, seconds,
                             cfg.place_latency_us * 1e-6, remote=remote, dies=homes,
                             die_hop_s=target.cross_die_hop_us * 1e-6, steal_wait_s=steal)
              for steal in (STEAL_WAITS_S if target.dies > 1 else STEAL_WAITS_S[:1])]
    return min(placed, key=lambda queues_est: queues_est[1])


def placement_homes(tasks: list[Task], target: Target, cfg: TileConfig, num_programs: int) -> int:
    """The homes the placement gives programs: a chiplet target's dies, else the config's lane_homes, else
    lane_homes()'s choice."""
    return target.dies if target.dies > 1 else cfg.lane_homes or lane_homes(tasks, num_programs)


HOME_TILES_PER_PROGRAM = 16     # lane homes where a lane's largest matvec op has this many tiles a program of its share


def lane_homes(tasks: list[Task], num_programs: int) -> int:
    """How many homes the placement gives a one-die GPU's programs: one per lane (program p prefers lane
    p % lanes' tasks, as a chiplet GPU's programs prefer their die's lanes) where one lane's tiles of some
    matvec op (an event) give every program of the lane's share at least HOME_TILES_PER_PROGRAM tiles, else 1
    (every program takes the first ready task of any lane). With homes a program streams long runs of one
    lane's tiles, and each lane's phases run on its own programs. H200, laneformer-7b (W1/W3: 1,024 tiles a
    lane, 20.7 a program of 49.5): -14.8%; its FP8 kernel (10.3 a program) +3.6%, laneformer-2b (5.2) +0.9%,
    2b FP8 (2.6) +21%, 0.5b (1.3) +4.8% (docs/design.md, Settings: lane_homes)."""
    lanes = max((t.lane for t in tasks), default=-1) + 1
    if lanes < 2:
        return 1
    most = max(Counter((t.group, t.lane) for t in tasks if t.kind == "matvec" and t.lane >= 0).values(), default=0)
    return lanes if most >= HOME_TILES_PER_PROGRAM * num_programs / lanes else 1


REFERENCE_ATTENTION_BYTES = 2 * 64 * 128 * 2     # a split of 64 positions, head_dim 128, 16-bit cache


def placement_kind_us(cfg: TileConfig) -> dict:
    """The per-kind times placement uses: the config's (a profile of this model: kogc.compile puts a
    model's shipped profile there), else none (the bytes model)."""
    return cfg.kind_us or {}


def kind_seconds(tasks: list[Task], kind_us: dict, bytes_per_s_per_program: float) -> list[float]:
    """Per task: the measured time of its kind (microseconds), or for a kind not listed the bytes
    model's estimate. Attention scales with its bytes past the reference split (longer contexts walk
    more cache rows per split; a profile's figure is taken as one for 64 positions of head_dim 128)."""
    return [kind_us[t.kind_key] * context_scale(t) * 1e-6 if t.kind_key in kind_us
            else bytes_model_seconds(t, bytes_per_s_per_program) for t in tasks]


def context_scale(t: Task) -> float:
    """How much longer than its kind's measured time a task takes: attention past the reference split
    (a profile's figure is one for 64 positions of head_dim 128), 1 for every other kind."""
    return max(1.0, t.cost_bytes / REFERENCE_ATTENTION_BYTES) if t.kind == "attention" else 1.0

"""A step's time from task bodies measured where HBM idles, with HBM shared as the kernel shares it:
the speed model behind `kogc predict`, no GPU needed.

Each program runs its queue in order. A task, once its program is free, pays a start (its header
and table reads), then issues its weight tile (or attention's cache rows): the GPU's HBM serves the
tiles in the order they are issued, each at the read bandwidth and no faster than one program can
take it, and they arrive one memory latency later. The task's body starts when its bytes have
arrived and each event it waits on has counted enough producers plus a hop; it takes its kind's
body time, and at its end the task counts on its events. A step is a greedy one: a task that skips its
waits when there is no filtered draw (a rank's count task) only publishes.

Why not the one-GPU profile's task times alone: they were measured with HBM saturated, so a rank of
several GPUs, whose programs stream a fraction of the bytes, gets them too long (at G = 8 an attention
body 4.1 us against 6.8, and the old model predicted 0.926 ms where the mirror measured 0.567). Here
the bodies are unloaded (from a rank with HBM mostly idle: the medians of
`kogc.analysis.stamps.bodies_of_file`) and the queue at HBM supplies the rest: one model for every G.
Served as equal shares instead of in order, every tile of a saturated GPU finished late (laneformer-2b
at G = 1 and 2: +15 to +35%): HBM is a queue.
"""
from __future__ import annotations

import dataclasses
import heapq
from collections import Counter, defaultdict

import numpy as np

from ..errors import KogcError
from ..runtime.profile import kind_key
from ..scheduler.schedule import REFERENCE_ATTENTION_BYTES
from ..scheduler.tasks import A_SLOT
from .body_tables import LANEFORMER_2B
from .stamps import body_us

COMBINE_SPLITS = 16     # the splits StreamParams.combine_us was fitted with


@dataclasses.dataclass
class StreamParams:
    """The model's constants (H200). start, latency and the per-program rate were fitted, with laneformer-2b's
    bodies (kogc.analysis.body_tables), to laneformer-2b's mirrored steps at G = 1, 2, 4, 8 (docs/multi-gpu.md);
    attention's bodies grow with a split's bytes, in part (attention_fixed_share)."""
    body_us: dict = dataclasses.field(default_factory=lambda: dict(LANEFORMER_2B.body_us))
    start_us: float = 0.5            # header and table reads before the tile is issued (measured: 0.4-0.7)
    latency_us: float = 0.7          # a tile's last byte leaving HBM to its arrival in registers
    program_gbs: float = 100.0       # the fastest one program takes a tile (GB/s)
    hbm_gbs: float = 4100.0          # the GPU's read bandwidth (GB/s)
    hop_us: float = 0.5              # a producer's publish reaching a waiter on the same GPU (measured notify)
    default_body_us: float = 1.5     # a kind with no body listed
    # where the last attention split of a KV head combines the splits (TileConfig.attn_combine_width): what the
    # combine adds to the split that ends last. Fitted to the three sweeps of that form on Laneformers (2b +5.7%,
    # 0.5b +3.5%, rank 0 of 8 +2.6%; modelled +1.5, +5.2, +4.8% with 2 us). Llama-3.2-1B's shapes, loaded, took
    # 3.8 us more in their last splits (8.77 against 4.93 us, medians of
    # docs/results/2026-12-02/task-times-llama-3.2-1b-1024-4d7398e.npz), where each KV head combines 4 heads.
    # That is for 16 splits (COMBINE_SPLITS); n splits take it times sqrt(n / 16), fitted to rank 0 of 8 mirrored on
    # an H100 with 32 and 64 splits against 16 (docs/multi-gpu.md, at longer contexts): in proportion to the splits
    # (their partials' loads overlap) it reads those steps long, at a flat 2 us short
    combine_us: float = 2.0
    # a matvec run (Schedule.run_lengths: a program's consecutive tiles of one variant and events, run as one loop
    # with one wait, the input vector formed once and one publish): each tile after the first costs this share of
    # its kind's body, its products (fp16 detail profile of laneformer-2b, docs/design.md, What bounds a step: W1/W3
    # 0.62 of 1.94 us, W2 0.72 of 2.81), and no start; the run's tiles all count at its last tile's end
    run_tile_share: float = 0.3
    # an attention body's share that does not grow with its split's cache bytes (the query, the stores, a pass of
    # the block loop): the body at B bytes is its kind's (a split of 64 positions of head_dim 128) times
    # share + (1 - share) x B / that split's bytes (the cache rows themselves queue at HBM as any tile). Fitted to
    # the steps measured from context 1024 to 4096 (docs/multi-gpu.md, the speed model): laneformer-2b's growth on
    # one H200 (+12.3%) wants 0.65-0.7, rank 0 of 8 mirrored on an H100 (+30%) 0.65, 7b's (+6.0%) 0.5, 0.5b's (+25.5%,
    # half-size splits at 1024) 0.4. A body in proportion to the bytes, never below the kind's, reads 2b's one-GPU
    # step 22% long at 4096
    attention_fixed_share: float = 0.6


def bodies_by_kind(schedule, ids: np.ndarray, ts: np.ndarray) -> dict[str, list[float]]:
    """Per kind, every task's body (after the waits to the end, us) of a profiled step."""
    per: dict = defaultdict(list)
    for t, us in zip(schedule.tasks, body_us(schedule, ids, ts)):
        per[kind_key(t)].append(us)
    return dict(per)


def _body(t, params: StreamParams) -> float:
    body = params.body_us.get(kind_key(t), params.default_body_us)
    if t.kind != "attention":
        return body
    share = params.attention_fixed_share
    return body * (share + (1 - share) * t.cost_bytes / REFERENCE_ATTENTION_BYTES)


def stream_replay(view, params: StreamParams, gpu_of_program: list[int] | None = None,
                  remote_events: set[int] = frozenset(), remote_us: float = 0.0,
                  also: dict[int, list[int]] | None = None) -> float:
    """One step (us) of a schedule, or of every rank's as one view (kogc.scheduler.ranks._Combined:
    pass its `also`, each program's GPU, and the receive events, whose waits take remote_us)."""
    tasks, queues = view.tasks, view.queues
    gpu_of = gpu_of_program or [0] * len(queues)
    also = also or {}
    hbm_free: dict[int, float] = defaultdict(float)       # GPU -> when HBM has served every tile issued
    hbm_rate, program_rate = params.hbm_gbs * 1e3, params.program_gbs * 1e3    # bytes per us
    prog = [0] * len(tasks)
    in_run = [False] * len(tasks)                          # a run's tile after its first
    publish_with = {}                                      # a run's last tile -> the run's other tiles
    for p, (q, lengths) in enumerate(zip(queues, view.run_lengths)):
        for k, (tid, n) in enumerate(zip(q, lengths)):
            prog[tid] = p
            in_run[tid] = n == 0
            if n > 1:
                publish_with[q[k + n - 1]] = q[k:k + n - 1]
    held = {u for us in publish_with.values() for u in us}  # they count with their run's last tile
    combining = _combining_groups(tasks)                   # last-split attention task -> its (lane, KV head)
    left = Counter(combining.values())                     # splits of each still to end
    combine = {g: params.combine_us * (n / COMBINE_SPLITS) ** 0.5 for g, n in left.items()}
    ends: dict[int, list[float]] = defaultdict(list)      # event -> its producers' end times, in order
    waiting: dict[int, list[int]] = defaultdict(list)     # event -> issued tasks short of it
    arrived = [0.0] * len(tasks)
    head = [0] * len(queues)
    heap: list = []                                        # (time, seq, task id, ended?)
    seq = 0

    def push(at: float, tid: int, ended: bool) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (at, seq, tid, ended))

    def try_start(tid: int) -> None:
        ready = arrived[tid]
        if tasks[tid].may_skip_waits:       # a greedy step's count task: no wait, nothing to do but publish
            push(ready, tid, True)
            return
        for g, n in tasks[tid].waits:
            if len(ends[g]) < n:
                waiting[g].append(tid)
                return
            ready = max(ready, ends[g][n - 1] + (remote_us if g in remote_events else params.hop_us))
        share = params.run_tile_share if in_run[tid] else 1.0
        push(ready + share * _body(tasks[tid], params), tid, True)

    for p, q in enumerate(queues):
        if q:
            push(params.start_us, q[0], False)
    done = last = 0
    while heap:
        now, _, tid, ended = heapq.heappop(heap)
        t = tasks[tid]
        if not ended:                                      # its start paid: the tile is issued
            nbytes, gpu = (0 if t.may_skip_waits else t.cost_bytes), gpu_of[prog[tid]]
            if nbytes > 0:
                hbm_free[gpu] = max(hbm_free[gpu], now) + nbytes / hbm_rate
                arrived[tid] = max(hbm_free[gpu], now + nbytes / program_rate) + params.latency_us
            else:
                arrived[tid] = now
            try_start(tid)
            continue
        if tid in combining and left[combining[tid]] > 0:
            left[combining[tid]] -= 1
            if left[combining[tid]] == 0:                  # the last split to end combines them, then publishes
                push(now + combine[combining[tid]], tid, True)
                continue
        done, last = done + 1, max(last, now)
        for u in () if tid in held else (*publish_with.get(tid, ()), tid):
            for g in (tasks[u].group, tasks[u].publish_too, *also.get(u, ())):
                if g >= 0:
                    ends[g].append(now)
                    for w in waiting.pop(g, []):
                        try_start(w)
        p = prog[tid]
        head[p] += 1
        if head[p] < len(queues[p]):
            nxt = queues[p][head[p]]
            push(now + (0.0 if in_run[nxt] else params.start_us), nxt, False)
    if done != len(tasks):
        short = next(g for g, ws in waiting.items() if ws)
        raise KogcError(f"stream replay: {len(tasks) - done} of {len(tasks)} tasks never ran; "
                        f"{tasks[waiting[short][0]].op} waits on event {short}, which never counts enough")
    return last


def _combining_groups(tasks) -> dict[int, tuple]:
    """Each attention task whose split may combine its KV head's splits (its variant's "last"): its group,
    (op, lane, KV head)."""
    return {t.id: (t.op, t.lane, t.args[A_SLOT]) for t in tasks if t.kind == "attention" and "last" in t.variant}

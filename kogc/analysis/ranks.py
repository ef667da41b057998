"""A model of delayed tensor parallelism's speed, no GPU needed: every rank's schedule replayed
together on one GPU each by the stream model (kogc.analysis.stream: unloaded task bodies, each GPU's
HBM a queue of the tiles its programs issue, a hop within a GPU and one across GPUs).

Absolute, not scaled by a one-GPU factor: on laneformer-2b's mirrored ranks (H200) it is within
-5% to +2% of every measured G from 1 to 8. With a measured one-GPU step it can also be calibrated
by that (the ratio at G = 1 applied to every G).
"""
from __future__ import annotations

import dataclasses

from ..ir.lanes import heads_as_lanes
from ..ir.shard import check_shardable, shard
from ..scheduler.ranks import _Combined, build_rank_schedules
from ..scheduler.fuse import fuse
from ..scheduler.schedule import build_schedule
from ..scheduler.tile import tile, tile_rank
from .stream import StreamParams, stream_replay

DEFAULT_CONTEXT = 1024      # positions the model prices attention at (kogc bench's default context)


def replay_ranks(schedules, params: StreamParams, remote_us: float) -> float:
    """One step (us) of G ranks' schedules, one GPU each, the stream model's."""
    if len(schedules) == 1:
        return stream_replay(schedules[0], params)
    view = _Combined(schedules)
    gpu_of = [r for r, s in enumerate(schedules) for _ in s.queues]
    remote = {view.eoff[r] + x.event for r, s in enumerate(schedules) for x in s.exchanges}
    return stream_replay(view, params, gpu_of, remote, remote_us, view.also)


def schedules_for(graph, G: int, target, cfg, context: int | None = None) -> list:
    """The schedules a step on G GPUs runs: one GPU's, or each rank's; with `context`, their attention tasks
    priced (cost_bytes: the cache a split reads) at that many positions, whatever context they were placed for."""
    if G == 1:
        schedules = [build_schedule(graph, target, tile_config=cfg)]
    else:
        schedules = build_rank_schedules(heads_as_lanes(graph, G), G, target, tile_config=cfg)  # (a decoder cut)
    placed_for = schedules[0].tile_config.cost_context
    if context is None or context == placed_for:
        return schedules
    # the same tasks, tiled again for the context (no placement): only the cost model's context differs, so only
    # the costs do
    priced = _tiled(graph, G, dataclasses.replace(schedules[0].tile_config, cost_context=context))
    for s, tasks in zip(schedules, priced):
        if [t.variant for t in s.tasks] != [t.variant for t in tasks]:
            raise AssertionError("the schedule tiled for another context holds other tasks")
        for t, q in zip(s.tasks, tasks):
            if t.kind == "attention":
                t.cost_bytes = q.cost_bytes
    return schedules


def _tiled(graph, G: int, cfg) -> list[list]:
    """Each schedule's tasks as tiling makes them with a resolved config, before any placement."""
    if G == 1:
        return [tile(graph, fuse(graph, cfg), cfg)[0]]
    cut = heads_as_lanes(graph, G)
    return [tile_rank(g, fuse(g, cfg), cfg)[0] for g in (shard(cut, G, r) for r in range(G))]


def predict(graph, target, config_for, gpus: list[int], params: StreamParams, remote_us: float,
            measured_one_gpu_ms: float | None = None, progress=None, context: int = DEFAULT_CONTEXT) -> list[dict]:
    """Per G in `gpus`: the modelled step (us, ms, tok/s) at `context` positions of the schedules placed with
    `config_for(G)` (the TileConfig a compile for G GPUs takes: kogc.settings.tile_config_for), and with
    `measured_one_gpu_ms` the same calibrated by it (predicted_ms)."""
    params = dataclasses.replace(params, hbm_gbs=target.hbm_read_bw / 1e9)
    for G in gpus:          # every rank count refused or accepted before the first (long) replay
        if G > 1:
            check_shardable(heads_as_lanes(graph, G), G)

    def step_us(G: int) -> float:
        return replay_ranks(schedules_for(graph, G, target, config_for(G), context), params, remote_us)

    steps = {}
    for G in gpus:
        if progress:
            progress(G)
        steps[G] = step_us(G)
    factor = measured_one_gpu_ms * 1e3 / (steps[1] if 1 in steps else step_us(1)) if measured_one_gpu_ms else None
    rows = []
    for G, us in steps.items():
        row = {"gpus": G, "model_us": us, "model_ms": us / 1e3, "model_tok_s": 1e6 / us}
        if factor:
            row.update(calibration=factor, predicted_ms=us * factor / 1e3, predicted_tok_s=1e6 / (us * factor))
        rows.append(row)
    return rows

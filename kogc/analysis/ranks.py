"""A model of delayed tensor parallelism's speed, no GPU needed: every rank's schedule replayed
together (the same semantics as the kernel: a program runs its queue in order, a task starts when
its waits' events are complete plus a hop), with each task's time from the placement's cost model
(the model's measured single-GPU task times where it ships them, else the bytes model), a hop latency
within a GPU and one across GPUs. Each rank has a whole GPU.

Calibrated: the replay of the one-GPU schedule against the measured one-GPU step gives a factor
(what the replay leaves out: start overheads, contention); the prediction for G GPUs is the replay
of G ranks times that factor. A model, to be checked against measurements on several GPUs.
"""
from __future__ import annotations

from ..scheduler.check import run_order
from ..scheduler.ranks import _Combined, build_rank_schedules
from ..scheduler.schedule import build_schedule, placement_seconds


def replay_us(schedules, local_us: float, remote_us: float, dies: int = 1, die_hop_us: float = 0.0) -> float:
    """One step of the ranks' schedules together (us): the end of the last task. With `dies` > 1, a
    wait whose event's last producer ran on another die (program p on die p % dies) than the waiter
    costs `die_hop_us` more."""
    view = _Combined(schedules)
    remote = {view.eoff[r] + x.event for r, s in enumerate(schedules) for x in s.exchanges}
    secs = []
    for s in schedules:
        secs += placement_seconds(s.tasks, s.tile_config, s.target, len(s.queues))
    prog = {tid: p for p, q in enumerate(view.queues) for tid in q}
    done_at = [0.0] * len(view.events)
    done_die = [0] * len(view.events)
    P = max(len(s.queues) for s in schedules)
    free: dict[int, float] = {}
    end_max = 0.0
    for tid in run_order(view.tasks, view.events, view.queues, view.also):
        t = view.tasks[tid]
        die = (prog[tid] % P) % dies if dies > 1 else 0
        start = max([free.get(prog[tid], 0.0)] +
                    [done_at[g] + (remote_us if g in remote else local_us)
                     + (die_hop_us if done_die[g] != die else 0.0) for g, _ in t.waits])
        end = start + secs[tid] * 1e6
        free[prog[tid]] = end
        end_max = max(end_max, end)
        for g in (t.group, *view.also.get(tid, ())):
            if end >= done_at[g]:
                done_at[g], done_die[g] = end, die
    return end_max


def predict(graph, target, cfg, gpus: list[int], local_us: float, remote_us: float,
            measured_one_gpu_ms: float | None = None, progress=None) -> list[dict]:
    """Per G in `gpus`: the replayed step (us), and with `measured_one_gpu_ms` the calibrated
    prediction (ms per token, tok/s)."""
    one = build_schedule(graph, target, tile_config=cfg)
    base = replay_us([one], local_us, remote_us)   # (one GPU: a schedule with no exchanges)
    factor = (measured_one_gpu_ms * 1e3 / base) if measured_one_gpu_ms else None
    rows = []
    for G in gpus:
        if progress:
            progress(G)
        us = base if G == 1 else replay_us(build_rank_schedules(graph, G, target, tile_config=cfg), local_us,
                                           remote_us)
        row = {"gpus": G, "replay_us": us}
        if factor:
            row.update(predicted_ms=us * factor / 1e3, predicted_tok_s=1e6 / (us * factor))
        rows.append(row)
    return rows


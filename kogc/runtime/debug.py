"""Narrow a mismatch between the kernel and the IR reference executor to the first stored value
that differs (values are compared in IR order, each lane on its own)."""
from __future__ import annotations

import torch

from ..ir.executor import execute


def diff_step(ck, weights: dict, state: dict, token: int, pos: int, rtol: float = 1e-3) -> list[str]:
    """Run one step on both; return one line per stored value, in IR order, flagging mismatches.

    `state` is the reference executor's KV caches (advanced in place, like the kernel's)."""
    ck.step(token, pos)
    _, env = execute(ck.ir, weights, state, [token, pos])
    lines = []
    act = ck.buffers.ACT.detach().cpu().float()
    for node in ck.ir.nodes:
        slot = ck.schedule.layout.slots.get(node.name)
        if slot is None or slot[0] != "act" or node.name not in env:
            continue
        _, off, per_lane, lanes = slot
        ref = env[node.name].detach().float().reshape(max(lanes, 1), per_lane)
        got = act[off:off + per_lane * max(lanes, 1)].reshape(max(lanes, 1), per_lane)
        err = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
        bad = not torch.isfinite(got).all() or err > rtol
        lines.append(f"{'MISMATCH' if bad else 'ok':8} {node.name:28} {node.op.value:16} rel err {err:.2e}")
    return lines

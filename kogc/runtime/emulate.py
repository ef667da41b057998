"""A GPU placement (many programs, each its queue) run under Triton's interpreter, which runs programs
one after another: one launch per task, in an order the queues and waits allow (the soundness
simulation's), each launch a view of the task's row, its queue's weight offset and a queue of one.
Slow (a launch per task), exact: the tables, the packed weight streams and the events are the GPU's.
For tests of placements the interpreter's own sequential one does not exercise (e.g. MI300X's XCD-aware
placement)."""
from __future__ import annotations

import torch

from ..scheduler.check import run_order
from .kernel import CompiledKernel


def step_task_by_task(ck: CompiledKernel, token: int, pos: int) -> tuple[torch.Tensor, int]:
    """One decode step of `ck` (compiled with interpret=True and a parallel placement), task by task:
    (logits, token) as CompiledKernel.step returns them."""
    s, b = ck.schedule, ck.buffers
    ck.epoch += 1
    where = {tid: (p, slot) for p, q in enumerate(s.queues) for slot, tid in enumerate(q)}
    woff = []                                 # per program and slot: where the task's weights start
    for p, q in enumerate(s.queues):
        at = int(b.WOFF[p])
        offs = []
        for tid in q:
            offs.append(at)
            w = s.tasks[tid].weight
            at += w.stream_elems if w is not None else 0
        woff.append(offs)
    one = torch.ones(1, dtype=b.QLEN.dtype)
    for tid in run_order(s.tasks, s.events, s.queues):
        p, slot = where[tid]
        view = b.kernel_args()
        view[1] = torch.tensor([woff[p][slot], woff[p][slot]], dtype=b.WOFF.dtype)
        view[2] = b.TABLE[p:p + 1, slot:]
        view[3] = one
        ck.launch(token, pos, grid=(1,), view=view, epoch0=ck.epoch)
        ck.raise_if_stuck()
    return ck.logits_view.clone(), int(b.OUT[0].item())

"""The Megatron-style tensor-parallel baseline on G GPUs: the hand-written step of the preset's shapes
(kogc.bench.handwritten: heads, KV heads and MLP split over the ranks, the LM head by vocabulary), an
NCCL all-reduce after the attention output and after the MLP, the whole step in ONE CUDA graph per
rank. Run inside a process group of G ranks, one GPU each."""
from __future__ import annotations

from .handwritten import graph_of, shapes_of_model, step_fn


def tp_graph_step(model, context: int, device: str, seed: int = 0):
    """`run(i)` replaying one decode step of the TP=world stack (one CUDA graph), and its weight bytes
    per GPU, of the model's shapes (kogc.bench.handwritten.shapes_of_model)."""
    import torch.distributed as dist

    def all_reduce(t, op="sum"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    step, nbytes = step_fn(shapes_of_model(model), context, device, seed, dist.get_world_size(), dist.get_rank(),
                           all_reduce)
    return graph_of(step), nbytes

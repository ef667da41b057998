"""Frontend: a PyTorch decode-step module -> the dataflow IR."""
from __future__ import annotations

import torch

from ..ir.graph import Graph
from ..ir.passes import run_passes
from .lower import lower
from .trace import FrontendError, trace


def to_ir(module: torch.nn.Module, passes: bool = True) -> Graph:
    """Trace `module` (one decode step: forward(token, pos)) and lower it to verified IR."""
    graph = lower(trace(module))
    return run_passes(graph) if passes else run_passes(graph, ())


__all__ = ["to_ir", "trace", "lower", "FrontendError"]

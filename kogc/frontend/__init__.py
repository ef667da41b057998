"""Frontend: a PyTorch decode-step module -> the dataflow IR.

Two captures, one IR:
- a model written for kogc (the Laneformer example: lane-batched einsum matvecs and kogc's helpers
  `rope_interleaved`, `kv_cache_write`, `gqa_attention` kept whole by torch.fx.wrap) is traced with
  torch.fx and lowered by kogc.frontend.lower;
- any other decoder (a single-file Llama, a transformers model) is captured with torch.export and
  lowered from ATen by kogc.frontend.aten, which recognises the usual idioms by pattern and probing.
"""
from __future__ import annotations

import sys

import torch

from ..ir.graph import Graph
from ..ir.passes import run_passes
from .hf import decode_step, is_transformers_model
from .lower import COMPOSITES, lower
from .trace import FrontendError, _user_frame_of_exception, trace


def written_for_kogc(module: torch.nn.Module) -> bool:
    """Whether the model's code uses kogc's fx-wrapped helpers (then torch.fx traces it)."""
    namespace = vars(sys.modules.get(type(module).__module__, object))
    return any(name in namespace for name in COMPOSITES)


def export_step(module: torch.nn.Module):
    """torch.export of one decode step (one token at one position, static shapes)."""
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    example = (torch.tensor(0, device=device), torch.tensor(0, device=device))
    name = type(module).__name__
    try:
        with torch.no_grad():
            return torch.export.export(module, example, strict=False)
    except Exception as e:  # noqa: BLE001 - any capture failure is the user's model: say where
        where = _user_frame_of_exception(e) or "<unknown source>"
        text = str(e).strip()
        if "data-dependent" in text or "data dependent" in text:
            raise FrontendError(f"cannot capture {name}.forward: a branch or size depends on a tensor's value "
                                f"(data-dependent control flow is not supported in a decode step) at {where}") from None
        msg = text.splitlines()[0] if text else type(e).__name__
        raise FrontendError(f"cannot capture {name}.forward(token, pos) with torch.export: {msg} at {where}") from None


def to_ir(module: torch.nn.Module, passes: bool = True, gpus: int = 1) -> Graph:
    """Capture `module` (one decode step: forward(token, pos) -> (logits, next token); a transformers
    model is wrapped first: kogc.frontend.hf) and lower it to verified IR. gpus > 1: an ordinary (one-lane)
    decoder is cut into that many lanes, to be spread over the GPUs (kogc.ir.lanes)."""
    module = decode_step(module)
    if written_for_kogc(module):
        graph = lower(trace(module))
    else:
        from .aten import AtenLowering
        graph, _ = AtenLowering(export_step(module), type(module).__name__).run()
    graph = run_passes(graph) if passes else run_passes(graph, ())
    if gpus > 1:
        from ..ir.lanes import heads_as_lanes
        graph = heads_as_lanes(graph, gpus)
    return graph


__all__ = ["to_ir", "trace", "lower", "FrontendError", "decode_step", "is_transformers_model", "export_step"]

"""Weights and caches seen through views: how a PARAM or STATE whose attrs carry "source" and "view" (set by
kogc.frontend.aten) is derived from the model's tensor when the kernel is packed or its cache filled."""
from __future__ import annotations

import torch


def derive_step(t: torch.Tensor, step) -> torch.Tensor:
    """One step of a weight's view (PARAM attrs "view"): how kogc packs a parameter as the IR uses it."""
    kind = step[0]
    if kind == "t":
        return t.t()
    if kind == "rows":
        return t[step[1]:step[2]]
    if kind == "rope_half":     # per head: rows (j, j + hd/2) become (2j, 2j + 1)
        hd = step[1]
        j = torch.arange(hd // 2)
        order = torch.stack((j, j + hd // 2), 1).reshape(-1)
        return t.reshape(-1, hd, *t.shape[1:])[:, order].reshape(t.shape)
    if kind == "rope_half_rows":   # the same order along the last axis (a KV cache's head_dim)
        hd = step[1]
        j = torch.arange(hd // 2)
        return t[..., torch.stack((j, j + hd // 2), 1).reshape(-1)]
    if kind == "tile":          # a per-head vector repeated for each of step[1] heads
        return t.repeat(step[1])
    if kind == "flat":
        return t.reshape(-1)
    if kind == "lane":
        return t.unsqueeze(0)
    if kind == "scale":         # a constant folded into a weight (kogc.frontend.aten.scale_param), in fp32
        return (t.float() * step[1]).to(t.dtype)
    if kind == "offset":        # a constant added to a weight (Gemma's norm scale 1 + w), in fp32
        return (t.float() + step[1]).to(t.dtype)
    raise ValueError(f"unknown weight view step {step!r}")


def step_name(step) -> str:
    return "-".join(str(s) for s in step)


def view_name(source: str, view) -> str:
    """A PARAM's name: its parameter's, then each view step's (`wq.weight#rows-0-64#lane`)."""
    return source + "".join(f"#{step_name(s)}" for s in view)

"""Weights and caches seen through views: how a PARAM or STATE whose attrs carry "source" and "view" (set by
kogc.frontend.aten) is derived from the model's tensor when the kernel is packed or its cache filled."""
from __future__ import annotations

import torch


def rope_half_order(hd: int, rot: int = 0) -> torch.Tensor:
    """A head's dims in interleaved-pair order, where rotate-half RoPE turns its first `rot` (all: 0) as pairs
    (j, j + rot/2): those pairs become (2j, 2j + 1), the dims it leaves alone (a partial rotary
    embedding's: GPT-NeoX's, Phi-2's) stay after them."""
    rot = rot or hd
    j = torch.arange(rot // 2)
    return torch.cat((torch.stack((j, j + rot // 2), 1).reshape(-1), torch.arange(rot, hd)))


def derive_step(t: torch.Tensor, step) -> torch.Tensor:
    """One step of a weight's view (PARAM attrs "view"): how kogc packs a parameter as the IR uses it."""
    kind = step[0]
    if kind == "t":
        return t.t()
    if kind == "rows":
        return t[step[1]:step[2]]
    if kind == "strided_rows":  # rows start..end of every block of `period` rows
        period, start, end = step[1:]
        return t.reshape(-1, period, *t.shape[1:])[:, start:end].reshape(-1, *t.shape[1:])
    if kind == "rope_half":     # per head: rows (j, j + rot/2) become (2j, 2j + 1), rows from rot on stay
        hd = step[1]
        return t.reshape(-1, hd, *t.shape[1:])[:, rope_half_order(*step[1:])].reshape(t.shape)
    if kind == "rope_half_rows":   # the same order along the last axis (a KV cache's head_dim)
        return t[..., rope_half_order(*step[1:])]
    if kind == "tile":          # a per-head vector repeated for each of step[1] heads
        return t.repeat(step[1])
    if kind == "flat":
        return t.reshape(-1)
    if kind == "lane":
        return t.unsqueeze(0)
    if kind == "lanes":         # rows cut into step[1] lanes, [L, N / L, ...] (kogc.ir.lanes: Q, K, V, the MLP's first)
        return t.reshape(step[1], t.shape[0] // step[1], *t.shape[1:])
    if kind == "lane_cols":     # columns cut into step[1] lanes, [L, N, K / L] (the output projection, the MLP's last)
        return t.reshape(t.shape[0], step[1], t.shape[1] // step[1]).transpose(0, 1).contiguous()
    if kind == "lane_first":    # a bias on the first of step[1] lanes, 0 on the others (added once to their sum)
        return torch.cat((t[None], torch.zeros((step[1] - 1,) + tuple(t.shape), dtype=t.dtype)))
    if kind == "lane_heads":    # a KV cache [1, kv, S, hd] as step[1] lanes of kv / L heads
        return t.reshape(step[1], t.shape[1] // step[1], *t.shape[2:])
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

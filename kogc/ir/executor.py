"""The reference executor: runs the IR op by op with torch on CPU (or any device).

This is the living definition of every op: later stages (the scheduler's tasks, the generated
kernel) are checked against it. Each op is written out here from its definition; none reuses the
user's model code. A lane-batched value is a tensor [L, *shape], a replicated one [*shape].
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from .graph import Graph, Node, Op, ValueType

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "int64": torch.int64}


def full_shape(t: ValueType) -> tuple[int, ...]:
    return ((t.lanes,) if t.lanes else ()) + t.shape


def new_state(graph: Graph, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Zeroed persistent state (KV caches) for every STATE node, keyed by its name attr."""
    return {n.attrs["name"]: torch.zeros(full_shape(n.type), dtype=TORCH_DTYPES[n.type.dtype], device=device)
            for n in graph.nodes if n.op is Op.STATE}


def _aligned(t: torch.Tensor, ty: ValueType, rank: int) -> torch.Tensor:
    """View as [L or 1, 1.., *shape] with `rank` per-lane dims, so lane and element axes line up."""
    lead = ty.lanes if ty.lanes else 1
    return t.reshape((lead,) + (1,) * (rank - len(ty.shape)) + ty.shape)


def _binary(fn):
    def run(node: Node, args, types):
        rank = len(node.type.shape)
        out = fn(*(_aligned(a, t, rank) for a, t in zip(args, types)))
        return out if node.type.lanes else out.squeeze(0)
    return run


def _rmsnorm(node, args, types):
    x = args[0].float()
    group = node.attrs.get("group")
    if group:
        x = x.reshape(x.shape[:-1] + (-1, group))
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + node.attrs["eps"])
    return y.reshape(args[0].shape).to(args[0].dtype)


def _layernorm(node, args, types):
    x = args[0]
    w, b = ([a.float() for a in args[1:]] + [None, None])[:2]
    y = torch.nn.functional.layer_norm(x.float(), x.shape[-1:], w, b, node.attrs["eps"])
    return y.to(x.dtype)


def _matvec(node, args, types):
    w, x = args[:2]
    b = args[2] if len(args) == 3 else None
    if types[0].lanes:
        y = torch.einsum("lnk,lk->ln", w, x)
        return y if b is None else y + b
    y = torch.nn.functional.linear(x, w, b)
    if node.attrs.get("softcap"):           # the LM head's soft cap (Gemma 2's logits): c tanh(W x)
        y = (node.attrs["softcap"] * torch.tanh(y.float())).to(y.dtype)
    return y


def rope_tables(graph: Graph) -> list[dict]:
    """The distinct attrs of the graph's ROPE nodes, in order of first use: the kernel's cos/sin tables, each
    [positions, head_dim / 2] (one for most models; Gemma 3's local and global layers rotate at two bases)."""
    tables: list[dict] = []
    for n in graph.nodes:
        if n.op is Op.ROPE and n.attrs not in tables:
            tables.append(n.attrs)
    return tables


def rope_table_offsets(graph: Graph, positions: int) -> dict[str, int]:
    """Each ROPE node's table's first element in the kernel's COS and SIN: the tables one after another,
    each of `positions` rows."""
    tables = rope_tables(graph)
    starts = [sum(positions * (t["head_dim"] // 2) for t in tables[:i]) for i in range(len(tables))]
    return {n.name: starts[tables.index(n.attrs)] for n in graph.nodes if n.op is Op.ROPE}


def alibi_table_offsets(graph: Graph, positions: int) -> dict[str, int]:
    """Each ALiBi attention node's slopes (fp32, one per query head) in the kernel's COS table, after the RoPE
    tables (kogc.ir.executor.rope_table_offsets), one node after another (SIN holds the same)."""
    at = sum(positions * (t["head_dim"] // 2) for t in rope_tables(graph))
    out = {}
    for n in graph.nodes:
        if n.op is Op.ATTENTION and n.attrs.get("alibi"):
            out[n.name] = at
            at += len(n.attrs["alibi"]["slopes"])
    return out


def rope_angles(pos: int, attrs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A ROPE node's cos and sin at `pos` for pairs j < hd/2, computed in fp32 (the kernel uses the same
    table): of pos * inv_freq[j], where inv_freq is the attrs' own list (a model's computed or stored
    table, e.g. with long-context scaling) or theta^(-2j/hd); times the attrs' scale (default 1)."""
    hd = attrs["head_dim"]
    if attrs.get("inv_freq") is not None:
        inv_freq = torch.tensor(attrs["inv_freq"], dtype=torch.float32)
    else:
        inv_freq = 1.0 / (attrs["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.tensor(float(pos), dtype=torch.float32) * inv_freq
    scale = attrs.get("scale", 1.0)
    return torch.cos(ang) * scale, torch.sin(ang) * scale


def _rope(node, args, types):
    x, pos = args
    hd = node.attrs["head_dim"]
    cos, sin = rope_angles(int(pos), node.attrs)
    pairs = x.float().reshape(x.shape[:-1] + (x.shape[-1] // hd, hd // 2, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.reshape(x.shape).to(x.dtype)


def _kv_write(node, args, types):
    cache, x, pos = args
    kv, _, hd = types[0].shape
    cache.select(-2, int(pos)).copy_(x.reshape(x.shape[:-1] + (kv, hd)))
    return cache


def _attention(node, args, types):
    q, k, v, pos = args
    kv, _, hd = types[1].shape
    p = int(pos) + 1
    lo = max(0, p - node.attrs["window"]) if node.attrs.get("window") else 0     # a sliding window's first
    qh = q.float().reshape(q.shape[:-1] + (kv, -1, hd))              # [.., kv, group, hd]
    keys, vals = k[..., lo:p, :].float(), v[..., lo:p, :].float()   # [.., kv, p - lo, hd]
    scores = qh @ keys.transpose(-1, -2) / hd ** 0.5                # [.., kv, group, p]
    if node.attrs.get("softcap"):                                   # a soft cap (Gemma 2): c tanh(s / c)
        scores = node.attrs["softcap"] * torch.tanh(scores / node.attrs["softcap"])
    if node.attrs.get("alibi"):                                     # ALiBi: + slope_h * (k + at), fp32
        scores = scores + alibi_bias(node.attrs["alibi"], lo, p, q.dtype).reshape(scores.shape[-3:])
    out = torch.softmax(scores, dim=-1) @ vals                      # [.., kv, group, hd]
    return out.reshape(q.shape).to(q.dtype)


def alibi_bias(alibi: dict, lo: int, end: int, dtype) -> torch.Tensor:
    """ALiBi's bias of each query head at key positions lo..end-1, [heads, end - lo]: slope_h * (k + at) in fp32,
    rounded to the model's dtype where the model rounds it (BLOOM's `alibi.to(dtype)`; MPT's stays fp32)."""
    slopes = torch.tensor(alibi["slopes"], dtype=torch.float32)
    bias = slopes[:, None] * (torch.arange(lo, end) + alibi["at"]).to(torch.float32)[None, :]
    return bias.to(dtype).float() if alibi.get("rounded") else bias


XIELU_CONSTANTS = ("alpha_p", "alpha_n", "beta", "eps")     # (in this order in a matvec task's arguments too:
                                                            # kogc.scheduler.tasks.A_XIELU)


def xielu(x: torch.Tensor, attrs: dict) -> torch.Tensor:
    """xIELU (Apertus's activation) as transformers computes it, in x's dtype (each op rounded there), the
    constants held in that dtype as the model holds them."""
    ap, an, beta, eps = (torch.tensor(attrs[k], dtype=x.dtype) for k in XIELU_CONSTANTS)
    return torch.where(x > 0, ap * x * x + beta * x, (torch.expm1(torch.minimum(x, eps)) - x) * an + beta * x)


def _argmax(node, args, types):
    return torch.argmax(args[0])


RUNNERS: dict[Op, Callable] = {
    Op.EMBED: lambda n, a, t: a[0][int(a[1])],
    Op.BROADCAST_LANES: lambda n, a, t: a[0].unsqueeze(0).expand((n.attrs["lanes"],) + tuple(a[0].shape)),
    Op.RMSNORM: _rmsnorm,
    Op.LAYERNORM: _layernorm,
    Op.MUL: _binary(torch.mul), Op.ADD: _binary(torch.add), Op.SUB: _binary(torch.sub),
    Op.SCALE: lambda n, a, t: a[0] * n.attrs["factor"],
    Op.SILU: lambda n, a, t: torch.nn.functional.silu(a[0]),
    Op.GELU: lambda n, a, t: torch.nn.functional.gelu(a[0]),
    Op.GELU_TANH: lambda n, a, t: torch.nn.functional.gelu(a[0], approximate="tanh"),
    Op.RELU: lambda n, a, t: torch.relu(a[0]),
    Op.RELU2: lambda n, a, t: torch.square(torch.relu(a[0])),
    Op.XIELU: lambda n, a, t: xielu(a[0], n.attrs),
    Op.MATVEC: _matvec,
    Op.ROPE: _rope,
    Op.KV_WRITE: _kv_write,
    Op.ATTENTION: _attention,
    Op.LANE_SUM: lambda n, a, t: a[0].sum(0),
    Op.LANE_MEAN: lambda n, a, t: a[0].mean(0),
    Op.LANE_SUM_OTHERS: lambda n, a, t: a[0].sum(0, keepdim=True) - a[0],
    Op.ARGMAX: _argmax,
}


class ExecutionError(RuntimeError):
    pass


def execute(graph: Graph, weights: Mapping[str, torch.Tensor], state: dict[str, torch.Tensor],
            inputs: list, stop_after: str | None = None) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Run one step. Returns (outputs, every value by name). `state` (KV caches) is updated in place.

    `stop_after` ends the run after that node (for narrowing a mismatch to the first diverging op)."""
    env: dict[str, torch.Tensor] = {}
    types = {n.name: n.type for n in graph.nodes}
    for node in graph.nodes:
        if node.op is Op.INPUT:
            env[node.name] = torch.as_tensor(inputs[node.attrs["index"]])
        elif node.op in (Op.PARAM, Op.STATE):
            src = weights if node.op is Op.PARAM else state
            t = src.get(node.attrs["name"])
            if t is None or tuple(t.shape) != full_shape(node.type):
                got = "missing" if t is None else f"shape {list(t.shape)}"
                raise ExecutionError(f"{node.op.value} {node.attrs['name']}: {got}, the IR needs {node.type}")
            env[node.name] = t
        elif node.op is Op.OUTPUT:
            return [env[i] for i in node.inputs], env
        else:
            args = [env[i] for i in node.inputs]
            env[node.name] = RUNNERS[node.op](node, args, [types[i] for i in node.inputs])
        if stop_after is not None and node.name == stop_after:
            return [], env
    raise ExecutionError("graph has no OUTPUT node")

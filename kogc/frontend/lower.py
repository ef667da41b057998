"""Lower a traced decode step (torch.fx) to the dataflow IR.

Each fx node maps to at most one IR node through a table of recognisers. Lane-batched tensors
([L, ...] in the model) become values of type `lanes=L` with the lane axis taken out of the
shape. Which tensors are lane-batched follows from the ops: a lane-batched matvec's weight
(`einsum("lnk,lk->ln")`), `expand` of a shared value to L copies, and, through elementwise ops,
everything computed from those. A weight's laned-ness is decided where it is first used.

Anything not in the tables raises FrontendError with the op and the user's source line.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..ir.graph import Graph, Op, ValueType
from .builder import IRBuilder
from .trace import user_frame

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.int64: "int64"}

# The model's composite helpers kept whole by torch.fx.wrap, by name: (IR op, number of tensor args).
COMPOSITES = {"rope_interleaved": Op.ROPE, "kv_cache_write": Op.KV_WRITE, "gqa_attention": Op.ATTENTION}


@dataclass
class Pending:
    """A weight or buffer (fx get_attr) not yet given an IR node: its laned-ness is set by its use."""
    qualname: str
    tensor: torch.Tensor
    is_state: bool


class Lowering(IRBuilder):
    def __init__(self, gm: fx.GraphModule):
        super().__init__()
        self.gm = gm
        self.env: dict[fx.Node, object] = {}         # fx node -> IR value name | Pending | python constant
        self.leaves: dict[tuple[str, int], str] = {}  # (qualname, lanes) -> IR name
        self.params = dict(gm.named_parameters())
        self.buffers = dict(gm.named_buffers())
        self.num_lanes = 0

    def leaf(self, p: Pending, lanes: int) -> str:
        key = (p.qualname, lanes)
        if key not in self.leaves:
            shape = tuple(p.tensor.shape)
            if lanes:
                if not shape or shape[0] != lanes:
                    self.fail(f"{p.qualname} of shape {list(shape)} is used per lane but its first axis is not {lanes} lanes")
                shape = shape[1:]
            dtype = DTYPE_NAMES.get(p.tensor.dtype)
            if dtype is None:
                self.fail(f"{p.qualname} has unsupported dtype {p.tensor.dtype}")
            op = Op.STATE if p.is_state else Op.PARAM
            saved = self.scope
            self.scope = p.qualname.rsplit(".", 1)[0]
            self.leaves[key] = self.emit(op, [], {"name": p.qualname}, ValueType(shape, dtype, lanes),
                                         hint=p.qualname.replace("model.", "").replace(".weight", ""))
            self.scope = saved
        return self.leaves[key]

    def value(self, arg, lanes: int = 0) -> str:
        """The IR value of an fx argument; a pending weight becomes a leaf with `lanes` lanes."""
        v = self.env.get(arg) if isinstance(arg, fx.Node) else None
        if isinstance(v, Pending):
            return self.leaf(v, lanes)
        if isinstance(v, str):
            return v
        self.fail(f"expected a tensor, got {arg!r}")

    def value_like(self, arg, other: str) -> str:
        """An operand of an elementwise op with `other`: a weight [L, *s] next to a lane-batched
        value whose per-lane rank is len(s) is lane-batched; otherwise it is shared."""
        v = self.env.get(arg) if isinstance(arg, fx.Node) else None
        if isinstance(v, Pending):
            t = self.types[other]
            shape = tuple(v.tensor.shape)
            laned = t.lanes and len(shape) == len(t.shape) + 1 and shape[0] == t.lanes
            return self.leaf(v, t.lanes if laned else 0)
        return self.value(arg)

    # ------------------------------------------------------------------ the walk
    def run(self) -> Graph:
        for n in self.gm.graph.nodes:
            self.where = user_frame(n.meta.get("stack_trace"))
            stack = n.meta.get("nn_module_stack") or {}
            self.scope = next(reversed(stack.values()))[0] if stack else ""
            handler = getattr(self, f"on_{n.op}")
            self.env[n] = handler(n)
        meta = {"num_lanes": self.num_lanes, "model": type(self.gm).__name__}
        return Graph(self.nodes, meta)

    def on_placeholder(self, n: fx.Node):
        # A decode step's inputs are int64 scalars: the token id and its position.
        index = sum(1 for x in self.nodes if x.op is Op.INPUT)
        return self.emit(Op.INPUT, [], {"index": index, "name": n.target}, ValueType((), "int64"), hint=n.target)

    def on_get_attr(self, n: fx.Node):
        if n.target in self.params:
            return Pending(n.target, self.params[n.target], False)
        if n.target in self.buffers:
            return Pending(n.target, self.buffers[n.target], True)
        self.fail(f"get_attr {n.target} is neither a parameter nor a buffer")

    def on_output(self, n: fx.Node):
        outs = n.args[0] if isinstance(n.args[0], (tuple, list)) else (n.args[0],)
        return self.emit(Op.OUTPUT, [self.value(o) for o in outs], {}, None, hint="output")

    def on_call_module(self, n: fx.Node):
        mod = self.gm.get_submodule(n.target)
        if isinstance(mod, torch.nn.Embedding):
            table = self.leaf(Pending(f"{n.target}.weight", mod.weight, False), 0)
            return self.emit(Op.EMBED, [table, self.value(n.args[0])], hint="embed")
        if isinstance(mod, torch.nn.Linear) and mod.bias is None:
            w = self.leaf(Pending(f"{n.target}.weight", mod.weight, False), 0)
            return self.emit(Op.MATVEC, [w, self.value(n.args[0])], hint=n.target.split(".")[-1])
        self.fail(f"unsupported module call {n.target} ({type(mod).__name__})")

    def on_call_method(self, n: fx.Node):
        handler = getattr(self, f"method_{n.target}", None)
        if handler is None:
            self.fail(f"unsupported tensor method .{n.target}()")
        return handler(n)

    def on_call_function(self, n: fx.Node):
        name = getattr(n.target, "__name__", str(n.target))
        if name in COMPOSITES:
            return self.composite(n, COMPOSITES[name])
        handler = _FUNCTIONS.get(n.target)
        if handler is None:
            module = getattr(n.target, "__module__", None)
            self.fail(f"unsupported op {module + '.' if module else ''}{name}")
        return handler(self, n)

    # ------------------------------------------------------------------ recognisers
    def composite(self, n: fx.Node, op: Op):
        args = list(n.args)
        if op is Op.ROPE:
            x, pos, head_dim, theta = args
            return self.emit(op, [self.value(x), self.value(pos)], {"head_dim": int(head_dim), "theta": float(theta)},
                             hint="rope")
        if op is Op.KV_WRITE:
            cache, x, pos = args
            xv = self.value(x)
            return self.emit(op, [self.value(cache, self.types[xv].lanes), xv, self.value(pos)], hint="kv_write")
        q, k, v, pos = args
        qv = self.value(q)
        return self.emit(op, [qv, self.value(k), self.value(v), self.value(pos)], hint="attn")

    def binary(self, n: fx.Node, op: Op):
        a, b = n.args
        if op is Op.MUL and isinstance(a, (int, float)) != isinstance(b, (int, float)):
            x, c = (b, a) if isinstance(a, (int, float)) else (a, b)
            return self.emit(Op.SCALE, [self.value(x)], {"factor": float(c)}, hint="scale")
        if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
            self.fail(f"{op.value} with a constant operand is not supported")
        a_is_w, b_is_w = (isinstance(self.env.get(x), Pending) for x in (a, b))
        if a_is_w and b_is_w:
            self.fail(f"{op.value} of two weights is not supported (fold them into one weight)")
        if a_is_w:
            bv = self.value(b)
            return self.emit(op, [self.value_like(a, bv), bv])
        av = self.value(a)
        return self.emit(op, [av, self.value_like(b, av)])

    def fn_rms_norm(self, n: fx.Node):
        x, shape = n.args[0], n.args[1]
        weight = n.kwargs.get("weight", n.args[2] if len(n.args) > 2 else None)
        eps = n.kwargs.get("eps", n.args[3] if len(n.args) > 3 else None)
        xv = self.value(x)
        t = self.types[xv]
        if tuple(shape) != t.shape[-1:]:
            self.fail(f"rms_norm over {list(shape)}: only the last axis ({t.shape[-1:]}) is supported")
        if eps is None:
            eps = torch.finfo(getattr(torch, t.dtype)).eps
        out = self.emit(Op.RMSNORM, [xv], {"eps": float(eps)}, hint="rmsnorm")
        if weight is not None:
            out = self.emit(Op.MUL, [out, self.value_like(weight, out)])
        return out

    def fn_einsum(self, n: fx.Node):
        eq, *operands = n.args
        if eq.replace(" ", "") != "lnk,lk->ln" or len(operands) != 2:
            self.fail(f"einsum {eq!r}: only the lane-batched matvec 'lnk,lk->ln' is supported")
        xv = self.value(operands[1])
        lanes = self.types[xv].lanes
        if not lanes:
            self.fail("einsum 'lnk,lk->ln' needs a lane-batched input (lanes first)")
        self.num_lanes = self.num_lanes or lanes
        return self.emit(Op.MATVEC, [self.value(operands[0], lanes), xv], hint="matvec")

    def fn_linear(self, n: fx.Node):
        x, w = n.args[:2]
        if (len(n.args) > 2 and n.args[2] is not None) or n.kwargs.get("bias") is not None:
            self.fail("linear with a bias is not supported")
        return self.emit(Op.MATVEC, [self.value(w), self.value(x)], hint="linear")

    def fn_argmax(self, n: fx.Node):
        if len(n.args) > 1 or n.kwargs.get("dim") is not None:
            self.fail("argmax over an axis is not supported, only over the whole vector")
        return self.emit(Op.ARGMAX, [self.value(n.args[0])], hint="argmax")

    def method_expand(self, n: fx.Node):
        xv = self.value(n.args[0])
        t = self.types[xv]
        sizes = n.args[1] if len(n.args) == 2 and isinstance(n.args[1], (tuple, list)) else n.args[1:]
        rest = [t.shape[i] if s == -1 else s for i, s in enumerate(sizes[1:])]
        if t.lanes or len(sizes) != len(t.shape) + 1 or tuple(rest) != t.shape or not isinstance(sizes[0], int):
            self.fail(f"expand{tuple(sizes)} of {t}: only copying a shared value to L lanes (a new first axis) is supported")
        self.num_lanes = self.num_lanes or sizes[0]
        return self.emit(Op.BROADCAST_LANES, [xv], {"lanes": int(sizes[0])}, hint="lanes")

    def _lane_reduce(self, n: fx.Node, op: Op):
        dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else None)
        xv = self.value(n.args[0])
        if dim not in (0, (0,), [0]) or not self.types[xv].lanes:
            self.fail(f".{n.target}(dim={dim}) of {self.types[xv]}: only a reduction over the lane axis (dim 0) "
                      f"of a lane-batched value is supported")
        return self.emit(op, [xv], hint=op.value)

    def method_sum(self, n):
        return self._lane_reduce(n, Op.LANE_SUM)

    def method_mean(self, n):
        return self._lane_reduce(n, Op.LANE_MEAN)


_FUNCTIONS = {
    operator.mul: lambda s, n: s.binary(n, Op.MUL), torch.mul: lambda s, n: s.binary(n, Op.MUL),
    operator.add: lambda s, n: s.binary(n, Op.ADD), torch.add: lambda s, n: s.binary(n, Op.ADD),
    operator.sub: lambda s, n: s.binary(n, Op.SUB), torch.sub: lambda s, n: s.binary(n, Op.SUB),
    F.rms_norm: Lowering.fn_rms_norm,
    torch.einsum: Lowering.fn_einsum,
    F.linear: Lowering.fn_linear,
    F.silu: lambda s, n: s.emit(Op.SILU, [s.value(n.args[0])], hint="silu"),
    torch.argmax: Lowering.fn_argmax,
    torch.sum: lambda s, n: s._lane_reduce(n, Op.LANE_SUM),
    torch.mean: lambda s, n: s._lane_reduce(n, Op.LANE_MEAN),
}


def lower(gm: fx.GraphModule) -> Graph:
    return Lowering(gm).run()

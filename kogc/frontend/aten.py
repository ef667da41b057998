"""Lower a decoder written the usual ways to the dataflow IR, from PyTorch's own capture.

`torch.export` (static shapes, one token at one position) gives an ATen graph in which shape
arithmetic, views and the usual idioms are already resolved. Each node's value is classified:

- `Const`: a constant tensor (a weight, a stored table); weights keep their name for packing;
- `PosFn`: depends only on the position (RoPE tables, causal masks, cache indices): evaluated at
  compile time for any position (kogc.frontend.probe), never lowered;
- `Vec`: an activation, an IR value (a flat vector; views, casts and order-keeping transposes of
  it are the same value);
- `Region`: a function of one activation and the position that is not an IR op by itself (the ops of
  RoPE in any of its forms): when something uses it, it is probed numerically and becomes ROPE;
- `Cache`: a KV cache, after this step's write, as seen through views (GQA's repeated heads);
- partial patterns (`Norm`, `Scores`) that become RMSNORM and ATTENTION when complete.

A plain decoder is the one-lane case of the Laneformer's IR: every activation has lanes=1, and the
LM head takes the lane mean (of one lane). Anything not recognised raises FrontendError naming the
ATen op and the user's source line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from ..ir.graph import Graph, Node, Op, ValueType
from ..ir.typing import IRTypeError, infer
from .probe import PosGraph, causal_allowed, is_causal_at, probe_positions, probe_rope
from .trace import FrontendError, user_frame

aten = torch.ops.aten
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
HALF = (torch.float16, torch.bfloat16)


@dataclass
class Const:
    tensor: torch.Tensor
    name: str | None = None          # the parameter it is a view of (None: computed)
    view: tuple = ()                 # how it is viewed: ("t",) for a transposed weight


@dataclass
class PosFn:
    node: fx.Node


@dataclass
class Tok:
    pass


@dataclass
class Vec:
    ir: str


@dataclass
class Region:
    root: fx.Node                    # the fx node whose value (an activation) the region starts from
    ir: str                          # that activation's IR value
    node: fx.Node


@dataclass
class Cache:
    ir: str                          # the KV_WRITE's value
    kv: int
    S: int
    hd: int
    probe: torch.Tensor = field(repr=False)    # (kv head * S + position) of every element, as viewed


@dataclass
class Norm:
    stage: str                       # "sq", "ms", "mse", "rs", "sqrt"
    x: str
    eps: float = 0.0


@dataclass
class Scores:
    q: str
    k: Cache
    scale: float = 1.0
    mask: tuple | None = None        # (PosFn, "additive" | "bool" | "fill")
    probs: bool = False


@dataclass
class Split:
    vec: str
    bounds: list


# ATen ops that change neither an activation's values nor their order (after the size-1 axes are
# dropped): views, copies, casts (the kernel computes in fp32 and stores in the model's dtype)
SAME = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
        aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.flatten.using_ints,
        aten.unflatten.int, aten.contiguous.default, aten.clone.default, aten.alias.default,
        aten.detach.default, aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default,
        aten.type_as.default, aten.dropout.default, aten.lift_fresh_copy.default, aten.view_copy.default}
REORDER = {aten.transpose.int, aten.permute.default, aten.t.default, aten.expand.default, aten.select.int,
           aten.slice.Tensor}
CASTS = {aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default, aten.type_as.default}
IGNORED = {aten._assert_tensor_metadata.default}
SOFTMAX = {aten.softmax.int, aten._softmax.default, aten._safe_softmax.default}
MATMUL = {aten.matmul.default, aten.bmm.default}


def _meta(n) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _squeezed(shape) -> tuple:
    return tuple(s for s in shape if s != 1)


def keeps_order(n: fx.Node) -> bool:
    """Whether a view-like op leaves a tensor's elements in row-major order (size-1 axes aside)."""
    src, out = _meta(n.args[0]), _meta(n)
    if src is None or out is None or src.numel() != out.numel():
        return False
    if n.target in SAME:
        return True
    if n.target in (aten.transpose.int, aten.permute.default, aten.t.default):
        if n.target is aten.t.default:
            perm = list(range(src.dim()))[::-1]
        elif n.target is aten.transpose.int:
            perm = list(range(src.dim()))
            a, b = (d % src.dim() for d in n.args[1:3])
            perm[a], perm[b] = perm[b], perm[a]
        else:
            perm = [d % src.dim() for d in n.args[1]]
        moved = [p for p in perm if src.shape[p] != 1]
        return moved == sorted(moved)
    if n.target is aten.expand.default:
        return _squeezed(src.shape) == _squeezed(out.shape)
    if n.target is aten.select.int:
        return src.shape[n.args[1] % src.dim()] == 1
    if n.target is aten.slice.Tensor:
        return tuple(src.shape) == tuple(out.shape)
    return False


class AtenLowering:
    def __init__(self, ep: torch.export.ExportedProgram, name: str):
        self.ep, self.gm = ep, ep.graph_module
        self.nodes: list[Node] = []
        self.types: dict[str, ValueType] = {}
        self.env: dict[fx.Node, object] = {}
        self.leaves: dict[tuple, str] = {}
        self.where = self.scope = ""
        self.name = name
        self.consts: dict[fx.Node, torch.Tensor] = {}
        self.pos_node = self.token_ir = self.pos_ir = None
        self.replicated: dict[str, str] = {}
        self.ropes: dict[fx.Node, str] = {}
        self.probed: dict[tuple, object] = {}      # region signature -> the probed Rope
        self.half_rotated: set[str] = set()     # ROPE values whose head dims are in interleaved order
        self.aliases: dict[str, list[fx.Node]] = {}     # IR value -> the fx nodes that are views of it
        self.max_pos = 0

    # ------------------------------------------------------------------ building
    def fail(self, msg: str):
        raise FrontendError(f"{msg} at {self.where or '<unknown source>'}")

    def emit(self, op: Op, inputs: list[str], attrs: dict | None = None, type_: ValueType | None = None,
             hint: str = "") -> str:
        attrs = attrs or {}
        if type_ is None:
            try:
                type_ = infer(op, [self.types[i] for i in inputs], attrs)
            except IRTypeError as e:
                self.fail(f"{op.value}: {e}")
        name = f"%{len(self.nodes)}" + (f".{hint}" if hint else "")
        self.nodes.append(Node(name, op, tuple(inputs), type_, attrs, self.where, self.scope))
        if type_ is not None:
            self.types[name] = type_
        return name

    def leaf(self, c: Const, lanes: int, view: tuple = ()) -> str:
        """A PARAM for weight `c` seen through `view` (steps applied to the parameter when packing:
        kogc.frontend.weights.derive), with `lanes` lanes (a lane axis of one added)."""
        if c.name is None:
            self.fail("a weight computed inside the model (not a parameter or buffer) is not supported")
        view = tuple(c.view) + tuple(view) + ((("lane",),) if lanes else ())
        key = (c.name, view)
        if key not in self.leaves:
            t = c.tensor
            for step in view:
                t = derive_step(t, step)
            dtype = DTYPE_NAMES.get(t.dtype)
            if dtype is None:
                self.fail(f"{c.name} has unsupported dtype {t.dtype}")
            shape = tuple(t.shape[1:]) if lanes else tuple(t.shape)
            attrs = {"name": c.name + "".join(f"#{_step_name(s)}" for s in view)}
            if view:
                attrs.update(source=c.name, view=[list(s) for s in view])
            saved, self.scope = self.scope, c.name.rsplit(".", 1)[0]
            self.leaves[key] = self.emit(Op.PARAM, [], attrs, ValueType(shape, dtype, lanes),
                                         hint=c.name.split(".")[-2] if "." in c.name else c.name)
            self.scope = saved
        return self.leaves[key]

    def vec(self, arg) -> str:
        v = self.env.get(arg) if isinstance(arg, fx.Node) else None
        if isinstance(v, Vec):
            return v.ir
        if isinstance(v, Region):
            return self.materialize(v)
        self.fail(f"expected an activation, got {self.describe(arg)}")

    def describe(self, arg) -> str:
        v = self.env.get(arg) if isinstance(arg, fx.Node) else arg
        kind = type(v).__name__
        return {"Const": "a constant", "PosFn": "a function of the position", "Cache": "a KV cache",
                "Norm": "part of an RMSNorm", "Scores": "attention scores", "Tok": "the token"}.get(kind, repr(v))

    # ------------------------------------------------------------------ the walk
    def run(self) -> tuple[Graph, int]:
        inputs = {s.arg.name: s for s in self.ep.graph_signature.input_specs}
        user = 0
        for n in self.gm.graph.nodes:
            self.where = user_frame(n.meta.get("stack_trace"))
            stack = n.meta.get("nn_module_stack") or {}
            self.scope = next(reversed(stack.values()))[0] if stack else ""
            if n.op == "placeholder":
                spec = inputs[n.name]
                kind = spec.kind.name
                if kind == "USER_INPUT":
                    self.env[n] = self.user_input(n, user)
                    user += 1
                else:
                    t = self.tensor_of(spec.target)
                    self.consts[n] = t
                    self.env[n] = Const(t, spec.target if kind in ("PARAMETER", "BUFFER") else None)
            elif n.op == "call_function":
                self.env[n] = self.call(n)
                if isinstance(self.env[n], Vec):
                    self.aliases.setdefault(self.env[n].ir, []).append(n)
            elif n.op == "output":
                self.output(n)
            else:
                self.fail(f"unsupported graph node {n.op}")
        return Graph(self.nodes, {"num_lanes": 1, "model": self.name}), self.max_pos

    def user_input(self, n: fx.Node, index: int):
        t = _meta(n)
        if index > 1 or t is None or t.dtype != torch.int64 or t.numel() != 1:
            self.fail(f"a decode step takes forward(token, pos), two int64 scalars; input {index} ({n.name}) is {t}")
        ir = self.emit(Op.INPUT, [], {"index": index, "name": n.name}, ValueType((), "int64"), hint=n.name)
        if index == 0:
            self.token_ir = ir
        if index == 1:
            self.pos_ir, self.pos_node = ir, n
            self.posgraph = PosGraph(self.consts, n, lambda x: isinstance(self.env.get(x), (Const, PosFn)))
            return PosFn(n)
        return Tok()

    def output(self, n: fx.Node):
        outs = n.args[0] if isinstance(n.args[0], (tuple, list)) else (n.args[0],)
        if len(outs) != 2:
            self.fail(f"a decode step returns (logits, next token); this one returns {len(outs)} values")
        logits = self.replicate(self.vec(outs[0]))
        tok = self.env.get(outs[1])
        if not (isinstance(tok, Vec) and self.by_name(tok.ir).op is Op.ARGMAX):
            self.fail("the second output must be the argmax of the logits")
        self.emit(Op.OUTPUT, [logits, tok.ir], {}, None, hint="output")

    def by_name(self, name: str) -> Node:
        return next(x for x in reversed(self.nodes) if x.name == name)

    # ------------------------------------------------------------------ one ATen op
    def call(self, n: fx.Node):
        t = n.target
        if t in IGNORED:
            return None
        if t is getattr(__import__("operator"), "getitem"):
            return self.getitem(n)
        tensors = [a for a in _flat_args(n) if isinstance(a, fx.Node)]
        kinds = [self.env.get(a) for a in tensors]
        if all(isinstance(k, (Const, PosFn)) or k is None for k in kinds):
            return self.constant(n, kinds)
        if any(isinstance(k, Tok) for k in kinds):
            return self.token_op(n)
        if t in (aten.index_copy_.default, aten.index_copy.default, aten.index_put_.default, aten.index_put.default):
            return self.kv_write(n)
        if t is aten.scaled_dot_product_attention.default:
            return self.sdpa(n)
        if any(isinstance(k, Cache) for k in kinds) and t not in MATMUL:
            return self.cache_view(n)
        if any(isinstance(k, (Scores,)) for k in kinds) or t in MATMUL:
            return self.written_attention(n)
        if any(isinstance(k, Norm) for k in kinds) or t in (aten.pow.Tensor_Scalar, aten.rsqrt.default):
            r = self.norm(n)
            if r is not None:
                return r
        if any(isinstance(k, Region) for k in kinds):
            return self.region(n)
        return self.activation(n)

    def constant(self, n: fx.Node, kinds):
        if any(isinstance(k, PosFn) for k in kinds):
            return PosFn(n)
        args = [self.env[a].tensor if isinstance(self.env.get(a), Const) else a for a in n.args]
        args = [[self.env[x].tensor if isinstance(self.env.get(x), Const) else x for x in a]
                if isinstance(a, (list, tuple)) else a for a in args]
        value = n.target(*args, **n.kwargs)
        self.consts[n] = value
        src = self.env.get(n.args[0]) if n.args and isinstance(n.args[0], fx.Node) else None
        if isinstance(src, Const) and src.name is not None:
            if n.target in CASTS or n.target in (aten.detach.default, aten.alias.default):
                return Const(value, src.name, src.view)
            if n.target is aten.t.default or (n.target is aten.transpose.int and value.dim() == 2) or \
                    (n.target is aten.permute.default and list(n.args[1]) == [1, 0]):
                return Const(value, src.name, src.view + (("t",),))
        return Const(value)

    def token_op(self, n: fx.Node):
        if n.target in SAME or n.target in REORDER:
            return Tok()
        if n.target is aten.embedding.default:
            table = self.env.get(n.args[0])
            if not isinstance(table, Const):
                self.fail("embedding of the token needs a weight table")
            e = self.emit(Op.EMBED, [self.leaf(table, 0), self.token_ir], hint="embed")
            return Vec(self.emit(Op.BROADCAST_LANES, [e], {"lanes": 1}, hint="lanes"))
        self.fail(f"unsupported op on the token: {_op_name(n)}")

    # ------------------------------------------------------------------ activations
    def activation(self, n: fx.Node):
        t = n.target
        if t in SAME or t in REORDER:
            src = self.env.get(n.args[0])
            if isinstance(src, Split):
                return self.fail(f"{_op_name(n)} of a split output")
            if keeps_order(n):
                return Vec(self.vec(n.args[0]))
            if t is aten.slice.Tensor:
                inner = self.row_block(n.args[0], n.args[1] if len(n.args) > 1 else 0)
                step = n.args[4] if len(n.args) > 4 else 1
                if inner and step == 1:
                    size = _meta(n.args[0]).shape[n.args[1]]
                    start, end = (list(n.args[2:4]) + [None, None])[:2]
                    start, end = start or 0, min(end if end is not None else size, size)
                    return Vec(self.matvec_rows(self.vec(n.args[0]), start * inner, end * inner))
            return self.region(n)
        if t in (aten.linear.default, aten.mm.default, aten.matmul.default):
            return self.linear(n)
        if t in (aten.split_with_sizes.default, aten.split.Tensor, aten.chunk.default):
            return self.split(n)
        if t in (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar):
            return self.mul(n)
        if t in (aten.add.Tensor, aten.sub.Tensor):
            return self.add(n)
        if t is aten.silu.default:
            return Vec(self.emit(Op.SILU, [self.vec(n.args[0])], hint="silu"))
        if t is aten.neg.default:
            return Vec(self.emit(Op.SCALE, [self.vec(n.args[0])], {"factor": -1.0}, hint="scale"))
        if t is aten.argmax.default:
            return self.argmax(n)
        if t is aten.rms_norm.default:
            return self.rms_norm(n)
        if t in (aten.view_as_complex.default, aten.cat.default, aten.stack.default, aten.unbind.int):
            return self.region(n)
        self.fail(f"unsupported op {_op_name(n)}")

    def linear(self, n: fx.Node):
        x, w = n.args[0], n.args[1]
        bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
        if bias is not None:
            self.fail("a linear layer with a bias is not supported")
        wc = self.env.get(w)
        if not isinstance(wc, Const):
            self.fail(f"{_op_name(n)} of two activations is only supported inside attention")
        view = () if n.target is aten.linear.default else (("t",),)
        if n.target is not aten.linear.default and wc.view[-1:] == (("t",),):
            wc, view = Const(wc.tensor, wc.name, wc.view[:-1]), ()
        xv = self.vec(x)
        out = self.emit(Op.MATVEC, [self.leaf(wc, 1, view), xv], hint=_short(wc.name))
        if _meta(n).shape[-1] != self.types[out].shape[0]:
            self.fail(f"{_op_name(n)}: the weight {wc.name} is not [out, in] as used")
        return Vec(out)

    def row_block(self, src: fx.Node, dim: int) -> int:
        """Rows of the matvec behind `src` per index of axis `dim`, when a slice or split there takes
        contiguous rows (a fused QKV or gate/up matrix split, by rows or by heads); else 0."""
        v, m = self.env.get(src), _meta(src)
        if not isinstance(v, Vec) or m is None or self.by_name(v.ir).op is not Op.MATVEC:
            return 0
        dim %= m.dim()
        if math.prod(m.shape[:dim]) != 1 or m.shape[dim] == 1:
            return 0
        return math.prod(m.shape[dim + 1:])

    def matvec_rows(self, ir: str, start: int, end: int) -> str:
        mv = self.by_name(ir)
        w = self.by_name(mv.inputs[0])
        c = self.param_const(w)
        view = tuple(tuple(s) for s in w.attrs.get("view", []) if s[0] != "lane") + (("rows", start, end),)
        return self.emit(Op.MATVEC, [self.leaf(Const(c.tensor, c.name), 1, view), mv.inputs[1]],
                         hint=_short(c.name))

    def param_const(self, w: Node) -> Const:
        src = w.attrs.get("source", w.attrs["name"])
        return Const(self.tensor_of(src), src)

    def tensor_of(self, target: str) -> torch.Tensor:
        state = self.ep.state_dict
        return state[target] if target in state else self.ep.constants[target]

    def split(self, n: fx.Node):
        dim = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)
        inner = self.row_block(n.args[0], dim)
        if not inner:
            return self.region(n)
        v = self.vec(n.args[0])
        size = _meta(n.args[0]).shape[dim]
        if n.target is aten.split_with_sizes.default:
            sizes = list(n.args[1])
        elif n.target is aten.split.Tensor:
            sizes = [min(n.args[1], size - i) for i in range(0, size, n.args[1])]
        else:
            sizes = [math.ceil(size / n.args[1])] * n.args[1]
        bounds, at = [], 0
        for s in sizes:
            bounds.append((at * inner, min(at + s, size) * inner))
            at += s
        return Split(v, bounds)

    def getitem(self, n: fx.Node):
        src = self.env.get(n.args[0])
        if isinstance(src, Split):
            a, b = src.bounds[n.args[1]]
            return Vec(self.matvec_rows(src.vec, a, b))
        if isinstance(src, Region):
            return Region(src.root, src.ir, n)
        if isinstance(src, (Const, PosFn)):
            return self.constant(n, [src])
        self.fail(f"indexing a result of {self.describe(n.args[0])}")

    def mul(self, n: fx.Node):
        a, b = n.args[:2]
        div = n.target in (aten.div.Tensor, aten.div.Scalar)
        ka, kb = self.env.get(a) if isinstance(a, fx.Node) else a, self.env.get(b) if isinstance(b, fx.Node) else b
        if isinstance(kb, (int, float)) or isinstance(ka, (int, float)):
            x, c = (a, kb) if isinstance(kb, (int, float)) else (b, ka)
            if div and x is not a:
                self.fail("dividing a constant by an activation is not supported")
            return Vec(self.emit(Op.SCALE, [self.vec(x)], {"factor": 1.0 / c if div else float(c)}, hint="scale"))
        if isinstance(ka, PosFn) or isinstance(kb, PosFn):
            return self.region(n)
        if div:
            self.fail("division of activations is not supported (outside an RMSNorm)")
        if isinstance(ka, Const) or isinstance(kb, Const):
            x, w = (b, ka) if isinstance(ka, Const) else (a, kb)
            xv = self.vec(x)
            if w.tensor.numel() == 1 and w.name is None:
                return Vec(self.emit(Op.SCALE, [xv], {"factor": float(w.tensor)}, hint="scale"))
            if tuple(_squeezed(w.tensor.shape)) != self.types[xv].shape:
                self.fail(f"multiplying by a weight of shape {list(w.tensor.shape)}: only an elementwise scale "
                          f"of the vector's width {self.types[xv].shape} is supported")
            wv = Const(w.tensor.reshape(-1), w.name, w.view + ((("flat",),) if w.tensor.dim() != 1 else ()))
            return Vec(self.emit(Op.MUL, [xv, self.leaf(wv, 0)]))
        return Vec(self.emit(Op.MUL, [self.vec(a), self.vec(b)]))

    def add(self, n: fx.Node):
        a, b = n.args[:2]
        alpha = n.kwargs.get("alpha", 1)
        if alpha != 1 or not all(isinstance(x, fx.Node) for x in (a, b)):
            self.fail(f"{_op_name(n)} with a constant is not supported on an activation")
        if any(isinstance(self.env.get(x), (PosFn, Const)) for x in (a, b)):
            self.fail(f"{_op_name(n)} of an activation and a constant tensor (a bias) is not supported")
        op = Op.ADD if n.target is aten.add.Tensor else Op.SUB
        return Vec(self.emit(op, [self.vec(a), self.vec(b)]))

    def argmax(self, n: fx.Node):
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        m = _meta(n.args[0])
        if dim is not None and len(_squeezed(m.shape)) > 1:
            self.fail("argmax over one axis of a matrix is not supported, only over the logits")
        return Vec(self.emit(Op.ARGMAX, [self.replicate(self.vec(n.args[0]))], hint="argmax"))

    def replicate(self, ir: str) -> str:
        """The LM head as one replicated matvec of the lane mean (the one-lane model's mean is its lane)."""
        if ir in self.replicated:
            return self.replicated[ir]
        node = self.by_name(ir)
        if node.op is not Op.MATVEC or not node.type.lanes:
            self.fail("the logits must come straight from the LM head's linear layer")
        w = self.by_name(node.inputs[0])
        view = tuple(tuple(s) for s in w.attrs.get("view", []) if s[0] != "lane")
        c = self.param_const(w)
        mean = self.emit(Op.LANE_MEAN, [node.inputs[1]], hint="lane_mean")
        out = self.emit(Op.MATVEC, [self.leaf(Const(c.tensor, c.name), 0, view), mean], hint="lm_head")
        self.replicated[ir] = out
        return out

    # ------------------------------------------------------------------ RMSNorm, as written out or whole
    def norm(self, n: fx.Node):
        t, args = n.target, n.args
        k = [self.env.get(a) if isinstance(a, fx.Node) else a for a in args]
        if t is aten.pow.Tensor_Scalar and isinstance(k[0], Vec) and args[1] == 2:
            return Norm("sq", k[0].ir)
        if t is aten.mul.Tensor and isinstance(k[0], Vec) and isinstance(k[1], Vec) and args[0] is args[1]:
            return Norm("sq", k[0].ir)
        if t is aten.mean.dim and isinstance(k[0], Norm) and k[0].stage == "sq":
            dims = [d % _meta(args[0]).dim() for d in args[1]]
            if dims != [_meta(args[0]).dim() - 1]:
                self.fail("an RMSNorm's mean must be over the last axis")
            return Norm("ms", k[0].x)
        if t is aten.add.Tensor and isinstance(k[0], Norm) and k[0].stage == "ms" and isinstance(k[1], (int, float)):
            return Norm("mse", k[0].x, float(k[1]))
        if t is aten.rsqrt.default and isinstance(k[0], Norm) and k[0].stage == "mse":
            return Norm("rs", k[0].x, k[0].eps)
        if t is aten.sqrt.default and isinstance(k[0], Norm) and k[0].stage == "mse":
            return Norm("sqrt", k[0].x, k[0].eps)
        if t in CASTS and isinstance(k[0], Norm):
            return k[0]
        if t in (aten.mul.Tensor, aten.div.Tensor):
            for x, r in ((k[0], k[1]), (k[1], k[0])):
                want = "rs" if t is aten.mul.Tensor else "sqrt"
                if isinstance(x, Vec) and isinstance(r, Norm) and r.stage == want and r.x == x.ir and \
                        (t is aten.mul.Tensor or x is k[0]):
                    return Vec(self.emit(Op.RMSNORM, [x.ir], {"eps": r.eps}, hint="rmsnorm"))
        if any(isinstance(x, Norm) for x in k):
            self.fail(f"{_op_name(n)} inside what looks like an RMSNorm: only x * rsqrt(mean(x^2) + eps) is supported")
        return None

    def rms_norm(self, n: fx.Node):
        x, shape = n.args[0], n.args[1]
        weight = n.args[2] if len(n.args) > 2 else n.kwargs.get("weight")
        eps = n.args[3] if len(n.args) > 3 else n.kwargs.get("eps")
        xv = self.vec(x)
        if tuple(shape) != self.types[xv].shape:
            self.fail(f"rms_norm over {list(shape)}: only the last axis is supported")
        if eps is None:
            eps = torch.finfo(_meta(x).dtype).eps
        out = self.emit(Op.RMSNORM, [xv], {"eps": float(eps)}, hint="rmsnorm")
        if weight is not None:
            out = self.emit(Op.MUL, [out, self.leaf(self.env[weight], 0)])
        return Vec(out)

    # ------------------------------------------------------------------ RoPE, found by probing
    def region(self, n: fx.Node):
        roots = set()
        for a in _flat_args(n):
            if isinstance(a, fx.Node):
                v = self.env.get(a)
                if isinstance(v, Region):
                    roots.add((v.root, v.ir))
                elif isinstance(v, Vec):
                    roots.add((a, v.ir))
                elif not isinstance(v, (Const, PosFn)) and v is not None:
                    self.fail(f"unsupported op {_op_name(n)} on {self.describe(a)}")
        if len({ir for _, ir in roots}) != 1:
            self.fail(f"unsupported op {_op_name(n)} (it combines several activations)")
        root, ir = roots.pop()
        return Region(root, ir, n)

    def materialize(self, r: Region) -> str:
        """The region as ROPE of its activation: probed at several positions (kogc.frontend.probe)."""
        if r.node in self.ropes:
            return self.ropes[r.node]
        out, root = _meta(r.node), _meta(r.root)
        where, self.where = self.where, user_frame(r.node.meta.get("stack_trace")) or self.where
        if out is None or root is None or out.numel() != root.numel() or out.is_complex():
            self.fail(f"unsupported op {_op_name(r.node)} on an activation")
        hd = out.shape[-1]

        views = [a for a in self.aliases.get(r.ir, []) if _meta(a) is not None] + [r.root]

        def f(x, pos):     # every view of the activation replaced by the probe vector
            subst = {a: x.reshape(_meta(a).shape) for a in views}
            return self.posgraph.value(r.node, pos, subst=subst, wide=True).reshape(-1)

        sig = self.region_signature(r.node, set(views))
        rope = self.probed.get(sig) if sig is not None else None
        if rope is None:
            rope = probe_rope(f, root.numel(), hd, self.max_pos or 1)
            if sig is not None and rope is not None:
                self.probed[sig] = rope
        if rope is None:
            self.fail(f"unsupported op {_op_name(r.node)}: these ops on an activation are not a rotary "
                      f"embedding (RoPE) kogc recognises")
        src = r.ir
        if rope.pairing == "half":      # rotate-half: the weight's rows reordered so that pairs interleave
            mv = self.by_name(src)
            if mv.op is not Op.MATVEC:
                self.fail("rotate-half RoPE must act on a linear layer's output")
            w = self.by_name(mv.inputs[0])
            view = tuple(tuple(s) for s in w.attrs.get("view", []) if s[0] != "lane") + (("rope_half", hd),)
            src = self.emit(Op.MATVEC, [self.leaf(self.param_const(w), 1, view), mv.inputs[1]], hint="rope_rows")
        ir = self.emit(Op.ROPE, [src, self.pos_ir], self.rope_attrs(rope), hint="rope")
        self.where = where
        self.ropes[r.node] = ir
        if rope.pairing == "half":
            self.half_rotated.add(ir)
        return ir

    def region_signature(self, out: fx.Node, views: set) -> tuple | None:
        """The region's computation as data: its ops in order, their constant arguments, the position
        functions and constants it reads (by node) and the activation's shape. Two regions with the same
        signature compute the same function (every layer's RoPE of the query, say): probed once."""
        order, index = [], {}

        def visit(n):   # (position functions are walked too: each layer computes its own views of a table)
            if n in index or n in views or n.op == "placeholder" or isinstance(self.env.get(n), Const):
                return
            for a in _flat_args(n):
                if isinstance(a, fx.Node):
                    visit(a)
            index[n] = len(order)
            order.append(n)

        visit(out)

        def arg(a):
            if isinstance(a, (list, tuple)):
                return tuple(arg(x) for x in a)
            if not isinstance(a, fx.Node):
                return a if isinstance(a, (int, float, bool, str, type(None))) else str(a)
            if a in views:
                return ("x", tuple(_meta(a).shape))
            if a in index:
                return ("op", index[a])
            c = self.env.get(a)
            return ("const", c.name or id(c.tensor)) if isinstance(c, Const) else ("input", a.name)

        try:
            return tuple((str(n.target), arg(list(n.args)), arg(sorted(n.kwargs.items()))) for n in order)
        except TypeError:
            return None

    def rope_attrs(self, rope) -> dict:
        """ROPE's attrs: theta when the probed frequencies are theta^(-2j/hd) (within fp32 rounding), else
        the list; the same attrs for every layer (the kernel holds one table), or an error."""
        hd, f = rope.head_dim, torch.tensor(rope.inv_freq, dtype=torch.float64)
        scale = 1.0 if abs(rope.scale - 1.0) < 1e-5 else rope.scale
        theta = float(f[1] ** (-hd / 2)) if hd > 2 and f[1] > 0 else 0.0
        if theta > 0:
            std = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            if torch.allclose(f, std, rtol=1e-5, atol=0):
                theta = float(f"{theta:.6g}")       # 10000.0, not 9999.99997
        attrs = {"head_dim": hd}
        std = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd) if theta > 0 else None
        if std is not None and torch.allclose(f, std, rtol=1e-5, atol=0):
            attrs["theta"] = theta
        else:
            attrs["inv_freq"] = [float(v) for v in f]
        if scale != 1.0:
            attrs["scale"] = scale
        first = getattr(self, "_rope", None)
        if first is None:
            self._rope = attrs
        elif first != attrs:
            same = first.keys() == attrs.keys() and all(
                torch.allclose(torch.tensor(first[k], dtype=torch.float64), torch.tensor(attrs[k], dtype=torch.float64),
                               rtol=1e-5) for k in attrs)
            if not same:
                self.fail(f"RoPE differs between layers ({first} and {attrs}): kogc holds one table")
        return dict(self._rope)

    # ------------------------------------------------------------------ the KV cache
    def kv_write(self, n: fx.Node):
        cache = n.args[0]
        c = self.env.get(cache)
        if not isinstance(c, Const) or c.name is None:
            self.fail(f"{_op_name(n)} must write a KV-cache buffer of the model")
        shape = _squeezed(c.tensor.shape)
        if len(shape) != 3 or c.tensor.shape[-1] != shape[-1]:
            self.fail(f"KV cache {c.name} of shape {list(c.tensor.shape)}: kogc supports [1, kv_heads, positions, head_dim]")
        kv, S, hd = shape if len(shape) == 3 else (1,) + shape
        seq_dim = c.tensor.dim() - 2
        if n.target in (aten.index_copy_.default, aten.index_copy.default):
            dim, index, values = n.args[1], n.args[2], n.args[3]
            if dim % c.tensor.dim() != seq_dim:
                self.fail(f"the KV cache {c.name} is written along axis {dim}, not its positions (axis {seq_dim})")
        else:
            indices, values = n.args[1], n.args[2]
            if len(indices) != seq_dim + 1 or any(i is not None for i in indices[:seq_dim]):
                self.fail(f"the KV cache {c.name} must be written as cache[..., pos, :] = x")
            index = indices[seq_dim]
        if not isinstance(self.env.get(index), PosFn):
            self.fail(f"the KV cache {c.name} must be written at an index computed from the position")
        self.max_pos = self.max_pos or S
        for p in probe_positions(S):
            got = self.posgraph.value(index, p).reshape(-1).tolist()
            if got != [p]:
                self.fail(f"the KV cache {c.name} is written at {got} for position {p}, not at the position")
        x = self.vec(values)
        vm = _meta(values)
        if _squeezed(vm.shape) != _squeezed((kv, hd)):
            self.fail(f"the value written into {c.name} has shape {list(vm.shape)}, not [kv_heads={kv}, head_dim={hd}]")
        dtype = DTYPE_NAMES[c.tensor.dtype]
        saved, self.scope = self.scope, c.name.rsplit(".", 1)[0]
        attrs = {"name": c.name}
        if x in self.half_rotated:   # the kernel's rows hold head dims (j, j + hd/2) as pairs (2j, 2j + 1)
            attrs["view"] = [["rope_half_rows", hd]]
        state = self.emit(Op.STATE, [], attrs, ValueType((kv, S, hd), dtype, 1), hint=_short(c.name))
        self.scope = saved
        w = self.emit(Op.KV_WRITE, [state, x, self.pos_ir], hint="kv_write")
        probe = (torch.arange(kv, dtype=torch.int32)[:, None, None] * S + torch.arange(S, dtype=torch.int32)[:, None]
                 ).expand(kv, S, hd).reshape(c.tensor.shape)
        out = Cache(w, kv, S, hd, probe)
        self.env[cache] = out        # later reads of the buffer see this step's write
        return out

    def cache_view(self, n: fx.Node):
        c = next(self.env[a] for a in _flat_args(n) if isinstance(self.env.get(a), Cache))
        if n.target not in SAME and n.target not in REORDER and n.target not in (aten.repeat_interleave.self_int, aten.repeat.default):
            self.fail(f"unsupported op {_op_name(n)} on a KV cache (only views, head repeats and attention)")
        args = [c.probe if isinstance(a, fx.Node) and self.env.get(a) is c else a for a in n.args]
        if n.target in CASTS:
            return c
        probe = n.target(*args, **{k: v for k, v in n.kwargs.items() if k != "output_size"})
        return Cache(c.ir, c.kv, c.S, c.hd, probe)

    def heads(self, c: Cache, nq: int, transposed: bool, gqa: bool = False) -> None:
        """Check that a viewed cache gives query head h the rows of KV head h // (nq / kv), all positions
        in order (the IR's GQA); transposed: [.., hd, S] (k^T)."""
        p = c.probe
        if transposed:
            p = p.transpose(-1, -2)
        if p.dim() < 3 or p.shape[-2:] != (c.S, c.hd):
            self.fail(f"attention over a KV cache seen as {list(c.probe.shape)}, not [.., heads, positions, head_dim]")
        p = p.reshape(-1, c.S, c.hd)
        h = p.shape[0]
        if gqa and h == c.kv:
            return
        if h != nq or nq % c.kv:
            self.fail(f"attention of {nq} query heads over {h} cache heads ({c.kv} KV heads)")
        g = nq // c.kv
        want = ((torch.arange(nq) // g)[:, None] * c.S + torch.arange(c.S)[None, :]).to(p.dtype)
        if not bool((p == want[:, :, None]).all()):
            self.fail("query heads must use the KV heads repeated in order (repeat_interleave or expand "
                      "over a new axis after the KV-head axis)")

    def check_mask(self, mask, kind: str):
        if mask is None:
            self.fail("attention over a static KV cache needs a causal mask (without one it reads unwritten rows)")
        if not isinstance(self.env.get(mask), PosFn):
            self.fail("an attention mask that depends on more than the position is not supported")
        for p in probe_positions(self.max_pos):
            m = self.posgraph.value(mask, p)
            try:
                allowed = causal_allowed(m, kind == "additive") if kind != "fill" else ~m.bool()
            except ValueError as e:
                self.fail(str(e))
            if not is_causal_at(allowed, p):
                self.fail(f"the attention mask at position {p} is not causal (positions 0..{p} of the cache)")

    def check_scale(self, scale: float, hd: int):
        if abs(scale * math.sqrt(hd) - 1.0) > 1e-5:
            self.fail(f"attention scaled by {scale}: only 1/sqrt(head_dim) = {1 / math.sqrt(hd):.6g} is supported")

    def attention(self, q: str, k: Cache, v: Cache) -> Vec:
        return Vec(self.emit(Op.ATTENTION, [q, k.ir, v.ir, self.pos_ir], hint="attn"))

    def sdpa(self, n: fx.Node):
        names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
        a = dict(zip(names, n.args))
        a.update(n.kwargs)
        q = self.vec(a["query"])
        k, v = self.env.get(a["key"]), self.env.get(a["value"])
        if not (isinstance(k, Cache) and isinstance(v, Cache)):
            self.fail("scaled_dot_product_attention must attend over the KV cache")
        qm = _meta(a["query"])
        if len(_squeezed(qm.shape)) > 2 or qm.shape[-2] != 1:
            self.fail(f"attention of a query of shape {list(qm.shape)}: one token at a time only")
        nq, hd = qm.numel() // qm.shape[-1], qm.shape[-1]
        if a.get("is_causal"):
            self.fail("is_causal=True with one query attends only position 0 of the cache (top-left causal); "
                      "pass a mask of positions <= pos instead")
        if a.get("dropout_p", 0.0):
            self.fail("attention dropout is not supported")
        for c in (k, v):
            self.heads(c, nq, False, bool(a.get("enable_gqa")))
        self.check_mask(a.get("attn_mask"), "bool" if _meta(a.get("attn_mask")) is not None and
                        _meta(a["attn_mask"]).dtype == torch.bool else "additive")
        if a.get("scale") is not None:
            self.check_scale(a["scale"], hd)
        return self.attention(q, k, v)

    def written_attention(self, n: fx.Node):
        t, args = n.target, n.args
        k = [self.env.get(x) if isinstance(x, fx.Node) else x for x in args]
        if t in MATMUL and isinstance(k[1], Cache) and not isinstance(k[0], Scores):
            qm = _meta(args[0])
            nq = qm.numel() // qm.shape[-1]
            self.heads(k[1], nq, True)
            return Scores(self.vec(args[0]), k[1])
        if not isinstance(k[0], Scores):
            if t in MATMUL:
                self.fail(f"{_op_name(n)} of two activations is only supported inside attention (q @ k^T, p @ v)")
            self.fail(f"unsupported op {_op_name(n)} on attention scores")
        s = k[0]
        if t in CASTS or t in SAME:
            return s
        if t in (aten.mul.Tensor, aten.div.Tensor) and isinstance(k[1], (int, float)) and not s.probs:
            f = 1.0 / k[1] if t is aten.div.Tensor else k[1]
            return Scores(s.q, s.k, s.scale * f, s.mask)
        if t is aten.add.Tensor and isinstance(k[1], PosFn) and s.mask is None:
            return Scores(s.q, s.k, s.scale, (args[1], "additive"))
        if t in (aten.masked_fill.Scalar, aten.masked_fill.Tensor) and isinstance(k[1], PosFn) and s.mask is None:
            if not (isinstance(args[2], float) and args[2] <= -1e4):
                self.fail("masked_fill of attention scores must fill with -inf")
            return Scores(s.q, s.k, s.scale, (args[1], "fill"))
        if t in SOFTMAX and not s.probs:
            if args[1] % _meta(args[0]).dim() != _meta(args[0]).dim() - 1:
                self.fail("softmax of attention scores must be over the cache positions (the last axis)")
            return Scores(s.q, s.k, s.scale, s.mask, probs=True)
        if t in MATMUL and s.probs and isinstance(k[1], Cache):
            self.heads(k[1], self.types[s.q].shape[0] // s.k.hd, False)
            self.check_mask(s.mask[0] if s.mask else None, s.mask[1] if s.mask else "")
            self.check_scale(s.scale, s.k.hd)
            return self.attention(s.q, s.k, k[1])
        self.fail(f"unsupported op {_op_name(n)} on attention scores")


# ---------------------------------------------------------------- weights seen through views

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
    if kind == "flat":
        return t.reshape(-1)
    if kind == "lane":
        return t.unsqueeze(0)
    raise ValueError(f"unknown weight view step {step!r}")


def _step_name(step) -> str:
    return "-".join(str(s) for s in step)


def _flat_args(n: fx.Node):
    for a in list(n.args) + list(n.kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _op_name(n: fx.Node) -> str:
    return f"aten.{getattr(n.target, '__name__', str(n.target))}"


def _short(name: str) -> str:
    parts = name.split(".")
    return parts[-2] if len(parts) > 1 else parts[0]

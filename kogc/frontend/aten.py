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

import dataclasses
import math

import torch
import torch.fx as fx

from ..ir.graph import Graph, Node, Op, ValueType
from ..ir.views import derive_step, view_name
from .aten_attention import AttentionLowering
from .aten_norms import NormLowering
from .aten_rope import RopeLowering
from .aten_values import (CASTS, DTYPE_NAMES, IGNORED, MATMUL, REORDER, SAME, Cache, Const, Norm, PosFn, Region, Scores,
                          SoftCap, Split, Tok, Vec, aten, keeps_order, meta, op_name, short, squeezed,
                          value_args)
from .builder import IRBuilder
from .probe import PosGraph
from .trace import FrontendError, user_frame


def rejoins_its_source(n: fx.Node) -> bool:
    """Whether slice `n` meets another slice of the same tensor again in a cat, directly or through
    one elementwise op (rotate-half RoPE: cat(-x[..., h:], x[..., :h])): then the slices are part of
    one function of that tensor (a Region), not rows of a fused matrix taken apart. (With one KV head
    the key's halves are slices of a plain vector, as a fused QKV's parts are.)"""
    def cats(m, depth=1):
        for u in m.users:
            if u.target is aten.cat.default:
                yield u
            elif depth and u.target in (aten.neg.default, aten.mul.Tensor):
                yield from cats(u, depth - 1)

    def slices_in(m, depth=1):
        if m.target is aten.slice.Tensor:
            yield m
        elif depth and m.target in (aten.neg.default, aten.mul.Tensor):
            for a in m.args:
                if isinstance(a, fx.Node):
                    yield from slices_in(a, depth - 1)
    for c in cats(n):
        for a in c.args[0]:
            if isinstance(a, fx.Node) and any(x is not n and x.args[0] is n.args[0] for x in slices_in(a)):
                return True
    return False


# ops that pick experts from a router's logits (Mixtral's, Qwen-MoE's, OLMoE's, Granite-MoE's)
ROUTING = (aten.softmax.int, aten._softmax.default, aten.topk.default, aten.sort.default)


class AtenLowering(IRBuilder, RopeLowering, AttentionLowering, NormLowering):
    def __init__(self, ep: torch.export.ExportedProgram, name: str):
        super().__init__()
        self.ep, self.gm = ep, ep.graph_module
        self.env: dict[fx.Node, object] = {}
        self.leaves: dict[tuple, str] = {}
        self.name = name
        self.consts: dict[fx.Node, torch.Tensor] = {}
        self.pos_node = self.token_ir = self.pos_ir = None
        self.replicated: dict = {}        # (the LM head's output, its soft cap) -> its replicated matvec
        self.ropes: dict[fx.Node, str] = {}
        self.ropes_seen: list[dict] = []            # each distinct ROPE attrs (rope_attrs), in order
        self.probed: dict[tuple, object] = {}      # region signature -> the probed Rope
        self.squares: dict[str, str] = {}          # relu(y) -> relu2(y), its square
        self.half_rotated: dict[str, int] = {}  # ROPE values whose head dims are in interleaved order: their
                                                # rotated dims (0: all)
        self.aliases: dict[str, list[fx.Node]] = {}     # IR value -> the fx nodes that are views of it
        self.max_pos = 0
        self.position_rows = None       # a learned position embedding's (table, positions it holds)

    # ------------------------------------------------------------------ building
    def leaf(self, c: Const, lanes: int, view: tuple = ()) -> str:
        """A PARAM for weight `c` seen through `view` (steps applied to the parameter when packing:
        kogc.ir.views.derive_step), with `lanes` lanes (a lane axis of one added)."""
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
            attrs = {"name": view_name(c.name, view)}
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
        if isinstance(v, Norm) and v.stage == "sq":     # a square read as an activation, not summed by a norm
            return self.squared(v.x)
        self.fail(f"expected an activation, got {self.describe(arg)}")

    def squared(self, x: str) -> str:
        """x * x where x is relu(y): squared ReLU of y (Nemotron's, Arcee's MLP), one node however often it is read."""
        node = self.by_name(x)
        if node.op is not Op.RELU:
            self.fail("the square of an activation is supported only as squared ReLU (relu(x) ** 2) or inside a norm")
        if x not in self.squares:
            self.squares[x] = self.emit(Op.RELU2, [node.inputs[0]], hint="relu2")
        return self.squares[x]

    def describe(self, arg) -> str:
        v = self.env.get(arg) if isinstance(arg, fx.Node) else arg
        kind = type(v).__name__
        return {"Const": "a constant", "PosFn": "a function of the position", "Cache": "a KV cache",
                "Norm": "part of a norm (RMSNorm or LayerNorm)", "Scores": "attention scores", "Tok": "the token"}.get(kind, repr(v))

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
        if self.position_rows and self.position_rows[1] < self.max_pos:
            name, rows = self.position_rows
            raise FrontendError(f"the position embedding {name} holds {rows} positions and the KV cache "
                                f"{self.max_pos}: pass a max_len (--max-len) of at most {rows}")
        return Graph(self.nodes, {"num_lanes": 1, "model": self.name}), self.max_pos

    def user_input(self, n: fx.Node, index: int):
        t = meta(n)
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
        out0 = self.env.get(outs[0])
        logits = self.replicate(out0.vec, out0.softcap) if isinstance(out0, SoftCap) else self.replicate(self.vec(outs[0]))
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
        tensors = [a for a in value_args(n) if isinstance(a, fx.Node)]
        kinds = [self.env.get(a) for a in tensors]
        if all(isinstance(k, (Const, PosFn)) or k is None for k in kinds):
            return self.constant(n, kinds)
        if any(isinstance(k, Tok) for k in kinds):
            return self.token_op(n)
        if t in (aten.index_copy_.default, aten.index_copy.default, aten.index_put_.default, aten.index_put.default):
            return self.kv_write(n)
        if t is aten.scaled_dot_product_attention.default:
            return self.sdpa(n)
        if t is aten.baddbmm.default:          # bias + alpha * q @ k^T (BLOOM's ALiBi)
            return self.written_attention(n)
        if any(isinstance(k, Cache) for k in kinds) and t not in MATMUL:
            return self.cache_view(n)
        if any(isinstance(k, Scores) for k in kinds) or (t in MATMUL and not any(isinstance(k, Const) for k in kinds)):
            return self.written_attention(n)
        if any(isinstance(k, SoftCap) for k in kinds):
            return self.soft_capped(n)
        if any(isinstance(k, Norm) for k in kinds) or t in (aten.pow.Tensor_Scalar, aten.square.default, aten.rsqrt.default,
                                                                aten.mean.dim):
            r = self.norm(n)
            if r is not None:
                return r
        if any(isinstance(k, Region) for k in kinds) and t not in (aten.linear.default, aten.addmm.default):
            return self.region(n)       # (a linear layer reads a region as the activation it computes)
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
                # a weight keeps its dtype through a cast (Gemma's `weight.float()`): the IR computes in the
                # model's dtype, and the kernel holds the weight as stored
                return Const(value.to(src.tensor.dtype) if value.is_floating_point() else value, src.name, src.view)
            if n.target in (aten.t.default, aten.numpy_T.default) or (n.target is aten.transpose.int and value.dim() == 2) or \
                    (n.target is aten.permute.default and list(n.args[1]) == [1, 0]):
                return Const(value, src.name, src.view + (("t",),))
            if n.target in (aten.add.Tensor, aten.add.Scalar) and isinstance(n.args[1], (int, float)) and \
                    n.kwargs.get("alpha", 1) == 1:      # Gemma's norms scale by (1 + weight)
                return Const(value, src.name, src.view + (("offset", float(n.args[1])),))
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
        self.fail(f"unsupported op on the token: {op_name(n)}")

    # ------------------------------------------------------------------ activations
    def activation(self, n: fx.Node):
        t = n.target
        if t in SAME or t in REORDER:
            src = self.env.get(n.args[0])
            if isinstance(src, Split):
                return self.fail(f"{op_name(n)} of a split output")
            if keeps_order(n):
                return Vec(self.vec(n.args[0]))
            if t in (aten.slice.Tensor, aten.select.int):
                dim = n.args[1] if len(n.args) > 1 else 0
                inner, period = self.row_block(n.args[0], dim)
                step = n.args[4] if t is aten.slice.Tensor and len(n.args) > 4 else 1
                # (a slice within a head stays a region: partial RoPE's q[..., :rot], rejoined by a cat that
                # rejoins_its_source does not see; whole rows of every block are taken: Falcon's q, k and v of
                # each KV head's group, qkv[:, :, :, :-2] and qkv[:, :, :, -2])
                if inner and (not period or inner > 1) and step == 1 and not rejoins_its_source(n):
                    size = meta(n.args[0]).shape[dim]
                    if t is aten.select.int:
                        start = n.args[2] % size
                        end = start + 1
                    else:
                        start, end = (list(n.args[2:4]) + [None, None])[:2]
                        start = 0 if start is None else start + size if start < 0 else start
                        end = size if end is None else end + size if end < 0 else min(end, size)
                    return Vec(self.matvec_rows(self.vec(n.args[0]), start * inner, end * inner, period))
            return self.region(n)
        if t in (aten.linear.default, aten.mm.default, aten.matmul.default, aten.addmm.default):
            return self.linear(n)
        if t in (aten.split_with_sizes.default, aten.split.Tensor, aten.chunk.default):
            return self.split(n)
        if t in (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar):
            return self.mul(n)
        if t in (aten.add.Tensor, aten.sub.Tensor) or (t is aten.add_.Tensor and len(n.args[0].users) == 1):
            return self.add(n)          # (in place on a value nothing else reads: Falcon's mlp_output += attention)
        if t is aten.silu.default:
            return Vec(self.emit(Op.SILU, [self.vec(n.args[0])], hint="silu"))
        if t is aten.relu.default:
            return Vec(self.emit(Op.RELU, [self.vec(n.args[0])], hint="relu"))
        if t is aten.gelu.default:
            approx = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
            op = Op.GELU_TANH if approx == "tanh" else Op.GELU
            return Vec(self.emit(op, [self.vec(n.args[0])], hint=op.value))
        if t is aten.tanh.default:
            x = self.vec(n.args[0])
            node = self.by_name(x)
            if node.op is not Op.MATVEC or len(node.inputs) == 3 or not node.type.lanes:
                self.fail("tanh of an activation is supported only as the logits' soft cap (c * tanh(logits / c), "
                          "the LM head's output)")
            return SoftCap(x)
        if t in (aten.pow.Tensor_Scalar, aten.tanh.default, aten.exp.default, aten.sigmoid.default, aten.erf.default,
                 aten.expm1.default, aten.minimum.default, aten.min.other, aten.gt.Scalar, aten.where.self):
            return self.region(n)       # part of an activation written out (materialize probes it)
        if t is aten.neg.default:
            return Vec(self.emit(Op.SCALE, [self.vec(n.args[0])], {"factor": -1.0}, hint="scale"))
        if t is aten.argmax.default:
            return self.argmax(n)
        if t is aten.rms_norm.default:
            return self.rms_norm(n)
        if t is aten.layer_norm.default:
            return self.layer_norm(n)
        if t in (aten.view_as_complex.default, aten.cat.default, aten.stack.default, aten.unbind.int):
            return self.region(n)
        if t in ROUTING:
            self.fail(f"unsupported op {op_name(n)}: a mixture of experts' routing (a softmax or top-k of an "
                      f"activation outside attention) is not supported; kogc compiles dense decoders")
        self.fail(f"unsupported op {op_name(n)}")

    def linear(self, n: fx.Node):
        if n.target is aten.addmm.default:      # bias + x @ W, W [in, out] (GPT-2's Conv1D)
            if n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1:
                self.fail(f"{op_name(n)} with beta or alpha other than 1 is not supported")
            bias, x, w = n.args[:3]
        else:
            x, w = n.args[0], n.args[1]
            bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
        bc = None if bias is None else self.env.get(bias)
        if bias is not None and not isinstance(bc, Const):
            self.fail(f"{op_name(n)}: a bias that is not a parameter is not supported")
        wc = self.env.get(w)
        if not isinstance(wc, Const):
            self.fail(f"{op_name(n)} of two activations is only supported inside attention")
        view = () if n.target is aten.linear.default else (("t",),)
        if n.target is not aten.linear.default and wc.view[-1:] == (("t",),):
            # x @ W.t(): W as stored (Falcon's `input @ self.weight.T`); the tensor in the weight's own orientation
            wc, view = Const(wc.tensor.t(), wc.name, wc.view[:-1]), ()
        xv = self.vec(x)
        ins = [self.leaf(wc, 1, view), xv] + ([self.leaf(bc, 1)] if bc is not None else [])
        out = self.emit(Op.MATVEC, ins, hint=short(wc.name))
        if meta(n).shape[-1] != self.types[out].shape[0]:
            self.fail(f"{op_name(n)}: the weight {wc.name} is not [out, in] as used")
        return Vec(out)

    def row_block(self, src: fx.Node, dim: int) -> tuple[int, int]:
        """(rows of the matvec behind `src` per index of axis `dim`, period) when a slice or split there takes
        rows of it: contiguous rows (period 0: a fused QKV or gate/up matrix split by rows or by heads), or
        the same rows of every block of `period` (an axis after others: GPT-NeoX's fused QKV viewed as
        [heads, 3 * head_dim] and split on its last axis, each head's q, k and v rows together); (0, 0) where
        it takes no rows."""
        v, m = self.env.get(src), meta(src)
        if not isinstance(v, Vec) or m is None or self.by_name(v.ir).op is not Op.MATVEC:
            return 0, 0
        dim %= m.dim()
        if m.shape[dim] == 1:
            return 0, 0
        period = math.prod(m.shape[dim:]) if math.prod(m.shape[:dim]) != 1 else 0
        return math.prod(m.shape[dim + 1:]), period

    def matvec_rows(self, ir: str, start: int, end: int, period: int = 0) -> str:
        """Rows start..end of matvec `ir` (of each block of `period` rows, where it is not 0) as a matvec of its own."""
        mv = self.by_name(ir)
        step = ("strided_rows", period, start, end) if period else ("rows", start, end)
        return self.matvec_again(mv, step, 1, mv.inputs[1], short(self.param_const(self.by_name(mv.inputs[0])).name))

    def matvec_again(self, mv: Node, step: tuple | None, lanes: int, x: str, hint: str, attrs: dict | None = None) -> str:
        """Matvec `mv` once more on input x: its weight and its bias (if any) seen through one more view
        step (None: none), with `lanes` lanes."""
        leaves = [self.param_again(self.by_name(name), step, lanes) for name in mv.inputs[:1] + mv.inputs[2:]]
        return self.emit(Op.MATVEC, [leaves[0], x] + leaves[1:], attrs, hint=hint)

    def param_again(self, p: Node, step: tuple | None, lanes: int) -> str:
        """PARAM p's parameter once more: through p's own view steps (less its lane axis) and `step`
        (None: none), with `lanes` lanes."""
        view = tuple(tuple(s) for s in p.attrs.get("view", []) if s[0] != "lane") + ((step,) if step else ())
        return self.leaf(self.param_const(p), lanes, view)

    def folded_scale(self, x: fx.Node, factor: float) -> str | None:
        """x * factor where x is read by nothing else, as a weight's view instead of an op: a linear layer's
        output scaled (Granite's residual_multiplier on each sublayer, its logits_scaling on the LM head)
        is the layer with its rows and bias scaled, a scaled embedding (its embedding_multiplier) the table
        scaled, a scaled norm its scale. None where it does not apply (the scale stays an op)."""
        node = self.by_name(self.vec(x))
        # every name the model has for the value (casts and views pass it on) read once, and nothing in the IR
        # reading it yet: no other reader sees it scaled
        names = [f for f, v in self.env.items() if isinstance(v, Vec) and v.ir == node.name]
        if any(len(f.users) != 1 for f in names):
            return None
        if node.op is Op.BROADCAST_LANES and self.by_name(node.inputs[0]).op is Op.EMBED:
            weights = [self.by_name(node.inputs[0]).inputs[0]]
        elif node.op in (Op.MATVEC, Op.EMBED):
            weights = [node.inputs[0]] + (list(node.inputs[2:]) if node.op is Op.MATVEC else [])
        elif node.op is Op.MUL and {self.by_name(i).op for i in node.inputs} == {Op.RMSNORM, Op.PARAM}:
            # a norm's output scaled (HyperCLOVAX's residual_multiplier after each sublayer's output norm): its
            # scale scaled
            weights = [i for i in node.inputs if self.by_name(i).op is Op.PARAM]
        else:
            return None
        uses = self.use_counts()
        if uses.get(node.name, 0) or any(uses.get(w, 0) != 1 for w in weights):
            return None
        for w in weights:
            self.scale_param(w, factor)
        return node.name

    def use_counts(self) -> dict[str, int]:
        """How many inputs of the IR built so far name each value."""
        uses: dict[str, int] = {}
        for n in self.nodes:
            for i in n.inputs:
                uses[i] = uses.get(i, 0) + 1
        return uses

    def scale_param(self, ir: str, factor: float) -> None:
        """PARAM `ir` seen through one more view step, a constant factor (before its lane axis): the node is
        replaced in place (its users keep its value's name), and the leaf it was is forgotten."""
        i, p = next((i, x) for i, x in enumerate(self.nodes) if x.name == ir)
        view = [tuple(s) for s in p.attrs.get("view", [])]
        lane = [s for s in view if s[0] == "lane"]
        view = [s for s in view if s[0] != "lane"] + [("scale", factor)] + lane
        source = p.attrs.get("source", p.attrs["name"])
        attrs = {**p.attrs, "name": view_name(source, view), "source": source, "view": [list(s) for s in view]}
        self.nodes[i] = dataclasses.replace(p, attrs=attrs)
        self.leaves = {k: v for k, v in self.leaves.items() if v != ir}

    def param_const(self, w: Node) -> Const:
        src = w.attrs.get("source", w.attrs["name"])
        return Const(self.tensor_of(src), src)

    def tensor_of(self, target: str) -> torch.Tensor:
        state = self.ep.state_dict
        return state[target] if target in state else self.ep.constants[target]

    def split(self, n: fx.Node):
        dim = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)
        inner, period = self.row_block(n.args[0], dim)
        if not inner:
            return self.region(n)
        v = self.vec(n.args[0])
        size = meta(n.args[0]).shape[dim]
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
        return Split(v, bounds, period)

    def getitem(self, n: fx.Node):
        src = self.env.get(n.args[0])
        if isinstance(src, Split):
            a, b = src.bounds[n.args[1]]
            return Vec(self.matvec_rows(src.vec, a, b, src.period))
        if isinstance(src, Region):
            return Region(src.root, src.ir, n)
        if isinstance(src, (Const, PosFn)):
            return self.constant(n, [src])
        self.fail(f"indexing a result of {self.describe(n.args[0])}")

    def mul(self, n: fx.Node):
        a, b = n.args[:2]
        div = n.target in (aten.div.Tensor, aten.div.Scalar)
        ka, kb = self.env.get(a) if isinstance(a, fx.Node) else a, self.env.get(b) if isinstance(b, fx.Node) else b
        # a one-element tensor (Gemma's embed_scale buffer, a torch.tensor made in forward) is a constant factor
        ka, kb = (float(k.tensor) if isinstance(k, Const) and k.tensor.numel() == 1 else k for k in (ka, kb))
        if isinstance(kb, (int, float)) or isinstance(ka, (int, float)):
            x, c = (a, kb) if isinstance(kb, (int, float)) else (b, ka)
            if div and x is not a:
                self.fail("dividing a constant by an activation is not supported")
            factor = 1.0 / c if div else float(c)
            return Vec(self.folded_scale(x, factor) or self.emit(Op.SCALE, [self.vec(x)], {"factor": factor},
                                                                  hint="scale"))
        if isinstance(ka, PosFn) or isinstance(kb, PosFn):
            return self.region(n)
        if div:
            self.fail("division of activations is not supported (outside an RMSNorm)")
        if isinstance(ka, Const) or isinstance(kb, Const):
            x, w = (b, ka) if isinstance(ka, Const) else (a, kb)
            xv = self.vec(x)
            width, per = self.types[xv].shape[0], w.tensor.numel()
            tiled = tuple(squeezed(w.tensor.shape)) == (per,) and per != width and width % per == 0 and \
                meta(x).shape[-1] == per       # a per-head scale on a [heads, head_dim] view (Qwen3's q_norm)
            if tuple(squeezed(w.tensor.shape)) != (width,) and not tiled:
                self.fail(f"multiplying by a weight of shape {list(w.tensor.shape)}: only an elementwise scale "
                          f"of the vector's width {self.types[xv].shape} (or of each head's) is supported")
            view = w.view + ((("flat",),) if w.tensor.dim() != 1 else ()) + ((("tile", width // per),) if tiled else ())
            ln = self.by_name(xv)
            rotated = ln.inputs[0] if ln.op is Op.RMSNORM and ln.inputs[0] in self.half_rotated else None
            if rotated:     # a norm's scale after rotate-half RoPE (HunYuan's): in the kernel's interleaved order
                rot = self.half_rotated[rotated]
                view += (("rope_half", self.by_name(rotated).attrs["head_dim"]) + ((rot,) if rot else ()),)
            wv = Const(w.tensor.reshape(-1), w.name, view)
            if ln.op is Op.LAYERNORM and len(ln.inputs) == 1 and not tiled and not self.use_counts().get(xv) and \
                    len(x.users) == 1:
                # a LayerNorm written out, then its weight (Cohere's, in fp32, rounded once): the op's own weight
                return Vec(self.emit(Op.LAYERNORM, [ln.inputs[0], self.leaf(wv, 0)], ln.attrs, hint="layernorm"))
            out = self.emit(Op.MUL, [xv, self.leaf(wv, 0)])
            if rotated:
                self.half_rotated[out] = self.half_rotated[rotated]
            return Vec(out)
        return Vec(self.emit(Op.MUL, [self.vec(a), self.vec(b)]))

    def add(self, n: fx.Node):
        a, b = n.args[:2]
        alpha = n.kwargs.get("alpha", 1)
        if alpha != 1 or not all(isinstance(x, fx.Node) for x in (a, b)):
            if alpha == 1 and any(isinstance(x, (int, float)) for x in (a, b)):
                return self.region(n)       # part of an activation written out (BLOOM's GELU: 1 + c * x * x)
            self.fail(f"{op_name(n)} with a constant is not supported on an activation")
        if n.target is aten.add.Tensor and any(isinstance(self.env.get(x), PosFn) for x in (a, b)):
            return self.position_embedding(n, *((a, b) if isinstance(self.env.get(b), PosFn) else (b, a)))
        if any(isinstance(self.env.get(x), (PosFn, Const)) for x in (a, b)):
            self.fail(f"{op_name(n)} of an activation and a constant tensor (a bias) is not supported")
        op = Op.SUB if n.target is aten.sub.Tensor else Op.ADD
        return Vec(self.emit(op, [self.vec(a), self.vec(b)]))

    def position_embedding(self, n: fx.Node, x: fx.Node, pe: fx.Node):
        """The token's embedding plus a learned position embedding (GPT-2's, OPT's): row pos + c of a table,
        c a constant offset (OPT's 2). One EMBED of the table's rows from c on, indexed by the position."""
        tok = self.by_name(self.vec(x))
        if not (tok.op is Op.BROADCAST_LANES and self.by_name(tok.inputs[0]).op is Op.EMBED):
            self.fail(f"{op_name(n)} of an activation and a function of the position is supported only as a "
                      f"position embedding added to the token's")
        look = pe
        while look.target in SAME or look.target in CASTS:
            look = look.args[0]
        table = self.env.get(look.args[0]) if look.target is aten.embedding.default else None
        if not (isinstance(table, Const) and table.name is not None and table.tensor.dim() == 2):
            self.fail(f"{op_name(n)}: a function of the position added to the token's embedding must be a row of "
                      f"a position embedding table (nn.Embedding indexed by the position)")
        rows, width = table.tensor.shape
        at = lambda p: int(self.posgraph.value(look.args[1], p).reshape(-1)[0])      # noqa: E731
        c = at(0)
        if c < 0 or any(at(p) != p + c for p in (1, 2, 3, 17, 100) if p + c < rows) or \
                width != self.types[tok.name].shape[0]:
            self.fail(f"{op_name(n)}: the position embedding {table.name} is not read at row pos + a constant, or "
                      f"its rows are not the embedding's width")
        self.position_rows = (table.name, rows - c)
        e = self.emit(Op.EMBED, [self.leaf(table, 0, (("rows", c, rows),) if c else ()), self.pos_ir], hint="pos_embed")
        s = self.emit(Op.ADD, [tok.inputs[0], e], hint="embeds")
        return Vec(self.emit(Op.BROADCAST_LANES, [s], {"lanes": 1}, hint="lanes"))

    def argmax(self, n: fx.Node):
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        m = meta(n.args[0])
        if dim is not None and len(squeezed(m.shape)) > 1:
            self.fail("argmax over one axis of a matrix is not supported, only over the logits")
        return Vec(self.emit(Op.ARGMAX, [self.replicate(self.vec(n.args[0]))], hint="argmax"))

    def soft_capped(self, n: fx.Node):
        """Ops on soft-capped logits: views and casts, the cap's multiplier, the argmax."""
        t, sc = n.target, self.env.get(n.args[0])
        if isinstance(sc, SoftCap) and (t in SAME or t in CASTS) and keeps_order(n):
            return sc
        if isinstance(sc, SoftCap) and t is aten.argmax.default:
            return Vec(self.emit(Op.ARGMAX, [self.replicate(sc.vec, sc.softcap)], hint="argmax"))
        if t in (aten.mul.Tensor, aten.mul.Scalar):
            caps = [self.env.get(a) for a in n.args[:2] if isinstance(self.env.get(a), SoftCap)]
            consts = [a for a in n.args[:2] if isinstance(a, (int, float))]
            if len(caps) == 1 and len(consts) == 1 and not caps[0].softcap:
                return SoftCap(caps[0].vec, float(consts[0]))
        self.fail(f"unsupported op {op_name(n)} after tanh: tanh of an activation is supported only as the logits' "
                  f"soft cap (c * tanh(logits / c), the step's logits)")

    def replicate(self, ir: str, softcap: float = 0.0) -> str:
        """The LM head as one replicated matvec of the lane mean (the one-lane model's mean is its lane);
        with softcap c its output is c * tanh(its product)."""
        key = (ir, softcap)
        if key not in self.replicated:
            node = self.by_name(ir)
            if node.op is not Op.MATVEC or not node.type.lanes:
                self.fail("the logits must come straight from the LM head's linear layer")
            if len(node.inputs) == 3 and softcap:
                self.fail("a soft-capped LM head with a bias is not supported")
            mean = self.emit(Op.LANE_MEAN, [node.inputs[1]], hint="lane_mean")
            self.replicated[key] = self.matvec_again(node, None, 0, mean, "lm_head",
                                                     {"softcap": softcap} if softcap else None)
        return self.replicated[key]

    # ------------------------------------------------------------------ RoPE, found by probing

"""RoPE for kogc.frontend.aten: the ops between a projection and their use, when they are a function of
that activation and the position alone, are a Region; where something uses it, it is probed
(kogc.frontend.probe) and becomes one ROPE node. A mixin of AtenLowering."""
from __future__ import annotations

import torch
import torch.fx as fx

from ..ir.graph import Op
from .aten_values import Const, PosFn, Region, Vec, flat_args, meta, op_name, value_args
from .probe import ACTIVATIONS, probe_activation, probe_rope, probe_xielu
from .trace import user_frame


class RopeLowering:
    def region(self, n: fx.Node):
        roots = set()
        for a in value_args(n):
            if isinstance(a, fx.Node):
                v = self.env.get(a)
                if isinstance(v, Region):
                    roots.add((v.root, v.ir))
                elif isinstance(v, Vec):
                    roots.add((a, v.ir))
                elif not isinstance(v, (Const, PosFn)) and v is not None:
                    self.fail(f"unsupported op {op_name(n)} on {self.describe(a)}")
        if len({ir for _, ir in roots}) != 1:
            # (a constant multiple of the region's activation is the same activation, GPT-2's and Phi-2's
            # written-out GELU, 0.5 * x * (1 + tanh(...)), as is a sum of such terms, xIELU's alpha_p * x * x +
            # beta * x: the region is rooted at that activation's first fx node)
            unscaled = {self.unscaled(ir) for _, ir in roots}
            if len(unscaled) == 1:
                ir = unscaled.pop()
                roots = {(self.aliases[ir][0], ir)}
        if len({ir for _, ir in roots}) != 1:
            self.fail(f"unsupported op {op_name(n)} (it combines several activations)")
        root, ir = roots.pop()
        return Region(root, ir, n)

    def unscaled(self, ir: str) -> str:
        """The activation a SCALE node (or a chain of them) multiplies, or that a MUL multiplies by itself or its
        multiples (BLOOM's GELU written out: 0.044715 * x * x), or that an ADD or SUB combines with its multiples;
        ir itself otherwise."""
        node = self.by_name(ir)
        if node.op is Op.SCALE:
            return self.unscaled(node.inputs[0])
        if node.op in (Op.MUL, Op.ADD, Op.SUB) and len({self.unscaled(i) for i in node.inputs}) == 1:
            return self.unscaled(node.inputs[0])
        return ir

    def materialize(self, r: Region) -> str:
        """The region as an activation function of its activation (an IR op: a GELU written out), or as ROPE
        of it: probed at several positions (kogc.frontend.probe)."""
        if r.node in self.ropes:
            return self.ropes[r.node]
        out, root = meta(r.node), meta(r.root)
        where, self.where = self.where, user_frame(r.node.meta.get("stack_trace")) or self.where
        if out is None or root is None or out.numel() != root.numel() or out.is_complex():
            self.fail(f"unsupported op {op_name(r.node)} on an activation")
        hd = out.shape[-1]

        views = [a for a in self.aliases.get(r.ir, []) if meta(a) is not None] + [r.root]

        def f(x, pos):     # every view of the activation replaced by the probe vector
            subst = {a: x.reshape(meta(a).shape) for a in views}
            return self.posgraph.value(r.node, pos, subst=subst, wide=True).reshape(-1)

        act = probe_activation(f, root.numel(), self.max_pos or 1)
        xielu = None if act else probe_xielu(f, root.numel(), self.max_pos or 1)
        if act or xielu:
            # (xIELU's constants as the model holds them: in its dtype)
            ir = self.emit(ACTIVATIONS[act], [r.ir], hint=act) if act else self.emit(
                Op.XIELU, [r.ir], {k: float(torch.tensor(v, dtype=out.dtype)) for k, v in xielu.items()}, hint="xielu")
            self.where = where
            self.ropes[r.node] = ir
            return ir

        sig = self.region_signature(r.node, set(views))
        rope = self.probed.get(sig) if sig is not None else None
        if rope is None:
            rope = probe_rope(f, root.numel(), hd, self.max_pos or 1)
            if sig is not None and rope is not None:
                self.probed[sig] = rope
        if rope is None:
            self.fail(f"unsupported op {op_name(r.node)}: these ops on an activation are neither an activation "
                      f"function ({', '.join(ACTIVATIONS)}, xielu) nor a rotary embedding (RoPE) kogc recognises")
        src = r.ir
        if rope.pairing == "half":      # rotate-half: the weight's rows reordered so that pairs interleave
            src = self.pairs_interleaved(src, (hd, rope.rotary) if rope.rotary else (hd,))
        ir = self.emit(Op.ROPE, [src, self.pos_ir], self.rope_attrs(rope), hint="rope")
        self.where = where
        self.ropes[r.node] = ir
        if rope.pairing == "half":
            self.half_rotated[ir] = rope.rotary
        return ir

    def region_signature(self, out: fx.Node, views: set) -> tuple | None:
        """The region's computation as data: its ops in order, their constant arguments, the position
        functions and constants it reads (by node) and the activation's shape. Two regions with the same
        signature compute the same function (every layer's RoPE of the query, say): probed once."""
        order, index = [], {}

        def visit(n):   # (position functions are walked too: each layer computes its own views of a table)
            if n in index or n in views or n.op == "placeholder" or isinstance(self.env.get(n), Const):
                return
            for a in flat_args(n):
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
                return ("x", tuple(meta(a).shape))
            if a in index:
                return ("op", index[a])
            c = self.env.get(a)
            return ("const", c.name or id(c.tensor)) if isinstance(c, Const) else ("input", a.name)

        try:
            return tuple((str(n.target), arg(list(n.args)), arg(sorted(n.kwargs.items()))) for n in order)
        except TypeError:
            return None

    def pairs_interleaved(self, src: str, order: tuple) -> str:
        """The value `src` with each head's dims in interleaved-pair order ((j, j + hd/2) -> (2j, 2j + 1);
        `order` (hd,) or (hd, rot): kogc.ir.views.rope_half_order):
        a linear layer's output by reordering its weight's (and bias's) rows, or a norm per head of one
        times a per-head scale (Qwen3's q_norm / k_norm: the norm does not see the order) by reordering the
        layer's rows and the scale."""
        node = self.by_name(src)
        if node.op is Op.MATVEC:
            return self.matvec_again(node, ("rope_half",) + order, 1, node.inputs[1], "rope_rows")
        if node.op is Op.MUL:
            norm, scale = (self.by_name(i) for i in node.inputs)
            if norm.op is Op.PARAM:
                norm, scale = scale, norm
            # a norm per head, or over the whole vector (OLMo2's q_norm / k_norm; one head's, a model with one
            # KV head): an order within each head changes neither
            group = norm.attrs.get("group") or norm.type.shape[0] if norm.op is Op.RMSNORM else 0
            if group and group % order[0] == 0 and scale.op is Op.PARAM and self.by_name(norm.inputs[0]).op is Op.MATVEC:
                rows = self.pairs_interleaved(norm.inputs[0], order)
                normed = self.emit(Op.RMSNORM, [rows], dict(norm.attrs), hint="rmsnorm")
                return self.emit(Op.MUL, [normed, self.param_again(scale, ("rope_half",) + order, 0)])
        self.fail("rotate-half RoPE must act on a linear layer's output (or its norm, per head or whole)")

    def rope_attrs(self, rope) -> dict:
        """ROPE's attrs: theta when the probed frequencies are theta^(-2j/hd) (within fp32 rounding), else
        the list; a layer's equal (within 1e-5) to an earlier layer's are that layer's (the kernel holds a
        table for each distinct attrs: kogc.ir.executor.rope_tables)."""
        hd, f = rope.head_dim, torch.tensor(rope.inv_freq, dtype=torch.float64)
        scale = 1.0 if abs(rope.scale - 1.0) < 1e-5 else rope.scale
        theta = float(f[1] ** (-hd / 2)) if hd > 2 and f[1] > 0 else 0.0
        if theta > 0:
            # the shortest theta that fits (10000.0, not 9999.99997; 1e6, not 999997.0: with 128 pairs the
            # probe's fp32 rounding of f[1] is multiplied by 128 in theta)
            for digits in range(1, 7):
                short = float(f"{theta:.{digits}g}")
                if torch.allclose(f, short ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd), rtol=1e-5, atol=0):
                    theta = short
                    break
        attrs = {"head_dim": hd}
        std = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd) if theta > 0 else None
        if std is not None and torch.allclose(f, std, rtol=1e-5, atol=0):
            attrs["theta"] = theta
        else:
            attrs["inv_freq"] = [float(v) for v in f]
        if scale != 1.0:
            attrs["scale"] = scale
        as64 = lambda v: torch.tensor(v, dtype=torch.float64)     # noqa: E731
        for known in self.ropes_seen:
            if known.keys() == attrs.keys() and all(torch.allclose(as64(known[k]), as64(attrs[k]), rtol=1e-5)
                                                    for k in attrs):
                return dict(known)
        self.ropes_seen.append(attrs)
        return dict(attrs)

    # ------------------------------------------------------------------ the KV cache

"""RMSNorm and LayerNorm for kogc.frontend.aten: torch's own ops, and each written out as its stages (a Norm
value until the last one makes the IR op). A mixin of AtenLowering."""
from __future__ import annotations

import torch
import torch.fx as fx

from ..ir.graph import Op
from .aten_values import CASTS, LAYER_NORM_STAGES, Const, Norm, Region, Vec, aten, meta, op_name


class NormLowering:
    def norm(self, n: fx.Node):
        t, args = n.target, n.args
        k = [self.env.get(a) if isinstance(a, fx.Node) else a for a in args]
        written_ln = self.written_layer_norm(n, t, args, k)
        if written_ln is not None:
            return written_ln
        squares = t is aten.square.default or t is aten.pow.Tensor_Scalar and args[1] == 2
        if squares and isinstance(k[0], Region):     # a norm of RoPE's output (HunYuan's q and k, normed after it)
            return Norm("sq", self.vec(args[0]))
        if squares and isinstance(k[0], Vec):
            return Norm("sq", k[0].ir)
        if t is aten.mul.Tensor and isinstance(k[0], Vec) and isinstance(k[1], Vec) and args[0] is args[1]:
            return Norm("sq", k[0].ir)
        if t is aten.mean.dim and isinstance(k[0], Norm) and k[0].stage == "sq":
            dims = [d % meta(args[0]).dim() for d in args[1]]
            if dims != [meta(args[0]).dim() - 1]:
                self.fail("an RMSNorm's mean must be over the last axis")
            width, axis = self.types[k[0].x].shape[0], meta(args[0]).shape[-1]
            if width % axis:
                self.fail(f"an RMSNorm over each {axis} of a vector of {width} is not supported")
            # over each head of a [heads, head_dim] view (Qwen3's q_norm / k_norm), or the whole vector
            return Norm("ms", k[0].x, group=axis if axis != width else 0)
        if t is aten.add.Tensor and isinstance(k[0], Norm) and k[0].stage == "ms" and isinstance(k[1], (int, float)):
            return Norm("mse", k[0].x, float(k[1]), k[0].group)
        if t is aten.rsqrt.default and isinstance(k[0], Norm) and k[0].stage == "mse":
            return Norm("rs", k[0].x, k[0].eps, k[0].group)
        if t is aten.sqrt.default and isinstance(k[0], Norm) and k[0].stage == "mse":
            return Norm("sqrt", k[0].x, k[0].eps, k[0].group)
        if t in CASTS and isinstance(k[0], Norm):
            return k[0]
        if t in (aten.mul.Tensor, aten.div.Tensor):
            for a, x, r in ((args[0], k[0], k[1]), (args[1], k[1], k[0])):
                want = "rs" if t is aten.mul.Tensor else "sqrt"
                if isinstance(x, Region) and isinstance(r, Norm) and r.stage == want:
                    x = Vec(self.vec(a))        # (RoPE's output, materialized when its square was)
                if isinstance(x, Vec) and isinstance(r, Norm) and r.stage == want and r.x == x.ir and \
                        (t is aten.mul.Tensor or x is k[0]):
                    attrs = {"eps": r.eps, **({"group": r.group} if r.group else {})}
                    out = self.emit(Op.RMSNORM, [x.ir], attrs, hint="rmsnorm")
                    if x.ir in self.half_rotated:   # (normed after rotate-half RoPE: still in interleaved order)
                        self.half_rotated[out] = self.half_rotated[x.ir]
                    return Vec(out)
        stage = next((x.stage for x in k if isinstance(x, Norm)), None)
        if stage == "sq" and all(x.stage == "sq" and self.by_name(x.x).op is Op.RELU for x in k if isinstance(x, Norm)):
            return None     # a square of relu(y) that no mean reads: squared ReLU (AtenLowering.vec)
        if stage in LAYER_NORM_STAGES:
            self.fail(f"{op_name(n)} inside what looks like a LayerNorm: only (x - mean(x)) * rsqrt(mean((x - mean(x))^2)"
                      f" + eps) is supported")
        if stage:
            self.fail(f"{op_name(n)} inside what looks like an RMSNorm: only x * rsqrt(mean(x^2) + eps) is supported")
        return None

    def written_layer_norm(self, n: fx.Node, t, args, k):
        """A LayerNorm written out (Cohere's): (x - mean(x)) * rsqrt(mean((x - mean(x))^2) + eps), over the last
        axis, as stages of a Norm; the product is one LAYERNORM (its weight, if any, joins it in `mul`). None where
        n is no such stage."""
        last = lambda: [d % meta(args[0]).dim() for d in args[1]] == [meta(args[0]).dim() - 1]   # noqa: E731
        if t is aten.mean.dim and isinstance(k[0], Vec):
            if not last() or meta(args[0]).shape[-1] != self.types[k[0].ir].shape[0]:
                self.fail("a mean of an activation is supported only as a LayerNorm's, over the whole last axis")
            return Norm("mean", k[0].ir)
        if t is aten.sub.Tensor and isinstance(k[0], Vec) and isinstance(k[1], Norm) and k[1].stage == "mean" and \
                k[1].x == k[0].ir:
            return Norm("c", k[0].ir)
        c = k[0] if isinstance(k[0], Norm) else None
        if c is None:
            return None
        if t is aten.pow.Tensor_Scalar and c.stage == "c" and args[1] == 2:
            return Norm("csq", c.x)
        if t is aten.mean.dim and c.stage == "csq" and last():
            return Norm("var", c.x)
        if t is aten.add.Tensor and c.stage == "var" and isinstance(k[1], (int, float)):
            return Norm("vare", c.x, float(k[1]))
        if t is aten.rsqrt.default and c.stage == "vare":
            return Norm("crs", c.x, c.eps)
        if t is aten.mul.Tensor and isinstance(k[1], Norm) and {c.stage, k[1].stage} == {"c", "crs"} and c.x == k[1].x:
            eps = c.eps if c.stage == "crs" else k[1].eps
            return Vec(self.emit(Op.LAYERNORM, [c.x], {"eps": eps}, hint="layernorm"))
        return None

    def rms_norm(self, n: fx.Node):
        x, shape = n.args[0], n.args[1]
        weight = n.args[2] if len(n.args) > 2 else n.kwargs.get("weight")
        eps = n.args[3] if len(n.args) > 3 else n.kwargs.get("eps")
        xv = self.vec(x)
        if tuple(shape) != self.types[xv].shape:
            self.fail(f"rms_norm over {list(shape)}: only the last axis is supported")
        if eps is None:
            eps = torch.finfo(meta(x).dtype).eps
        out = self.emit(Op.RMSNORM, [xv], {"eps": float(eps)}, hint="rmsnorm")
        if weight is not None:
            out = self.emit(Op.MUL, [out, self.leaf(self.env[weight], 0)])
        return Vec(out)

    def layer_norm(self, n: fx.Node):
        """F.layer_norm over the last axis, its weight and bias (each optional, a bias only beside a weight)
        inside the one op: it rounds once, after the affine, as torch's does."""
        args = list(n.args) + [None] * (5 - len(n.args))
        x, shape, weight, bias, eps = args[:5]
        weight, bias = n.kwargs.get("weight", weight), n.kwargs.get("bias", bias)
        eps = n.kwargs.get("eps", 1e-5 if eps is None else eps)
        xv = self.vec(x)
        if tuple(shape) != self.types[xv].shape:
            self.fail(f"layer_norm over {list(shape)}: only the whole last axis ({self.types[xv].shape[0]}) is supported")
        affine = []
        for what, a in (("weight", weight), ("bias", bias)):
            if a is None:
                continue
            if not isinstance(self.env.get(a), Const):
                self.fail(f"a LayerNorm's {what} that is not a parameter is not supported")
            affine.append(self.leaf(self.env[a], 0))
        if bias is not None and weight is None:
            self.fail("a LayerNorm with a bias and no weight is not supported")
        return Vec(self.emit(Op.LAYERNORM, [xv] + affine, {"eps": float(eps)}, hint="layernorm"))

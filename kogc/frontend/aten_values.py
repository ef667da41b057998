"""What kogc.frontend.aten knows of each ATen value, and the ATen op sets and shape helpers it uses."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

aten = torch.ops.aten
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


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


LAYER_NORM_STAGES = ("mean", "c", "csq", "var", "vare", "crs")     # a LayerNorm written out (kogc.frontend.aten_norms)


@dataclass
class Norm:
    stage: str                       # RMSNorm: "sq", "ms", "mse", "rs", "sqrt"; LayerNorm written out (Cohere's):
                                     # "mean", "c" (x - mean), "csq", "var", "vare", "crs"
    x: str
    eps: float = 0.0
    group: int = 0                   # the mean over each `group` elements (a norm per head), 0: over all


@dataclass
class Scores:
    q: str
    k: Cache
    scale: float = 1.0
    mask: tuple | None = None        # (PosFn, "additive" | "bool" | "fill")
    probs: bool = False
    tanh: bool = False               # tanh(scale * q.k) taken (a soft cap: Gemma 2's), times `softcap` next
    softcap: float = 0.0
    bias: fx.Node | None = None      # a constant added to the scores (ALiBi's, checked when attention completes)


@dataclass
class SoftCap:
    """softcap * tanh(vec): the logits soft-capped (Gemma 2's final_logit_softcapping; `vec` is the LM head's
    output, the model's division by the cap folded into its rows); softcap 0 until the multiplier is seen."""
    vec: str
    softcap: float = 0.0


@dataclass
class Split:
    vec: str
    bounds: list
    period: int = 0     # the bounds are rows of each block of `period` (kogc.frontend.aten.row_block)


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


def meta(n) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def squeezed(shape) -> tuple:
    return tuple(s for s in shape if s != 1)


def keeps_order(n: fx.Node) -> bool:
    """Whether a view-like op leaves a tensor's elements in row-major order (size-1 axes aside)."""
    src, out = meta(n.args[0]), meta(n)
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
        return squeezed(src.shape) == squeezed(out.shape)
    if n.target is aten.select.int:
        return src.shape[n.args[1] % src.dim()] == 1
    if n.target is aten.slice.Tensor:
        return tuple(src.shape) == tuple(out.shape)
    return False


def flat_args(n: fx.Node):
    for a in list(n.args) + list(n.kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def value_args(n: fx.Node):
    """The arguments whose values n computes with: all of them, but type_as's first alone (its second gives a dtype:
    NanoChat's norm(x.float()).type_as(x))."""
    return n.args[:1] if n.target is aten.type_as.default else flat_args(n)


def op_name(n: fx.Node) -> str:
    return f"aten.{getattr(n.target, '__name__', str(n.target))}"


def short(name: str) -> str:
    parts = name.split(".")
    return parts[-2] if len(parts) > 1 else parts[0]

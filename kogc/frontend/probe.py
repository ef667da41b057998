"""What a model computes from the position alone, found by running it, not by reading its code.

A decode step's RoPE tables, causal masks and cache indices depend only on `pos` and constants;
models write them in many ways (a stored complex table indexed by position, cos/sin computed from
`inv_freq`, a boolean or additive mask, ...). kogc evaluates such sub-graphs at chosen positions and
checks the result against the one meaning it supports; anything else is refused with the op's line.

`PosGraph` evaluates fx nodes that depend only on `pos` and constant tensors; `probe_rope` finds the
rotation a sub-graph applies to a vector (pairing, frequencies, amplitude) and checks it everywhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..ir.executor import RUNNERS, xielu
from ..ir.graph import Op


class PosGraph:
    """Evaluates nodes whose values depend only on the position and constants, at any position.
    `consts` maps placeholder nodes to tensors; `pos_node` is the position input."""

    def __init__(self, consts: dict, pos_node: fx.Node, fixed=lambda node: False):
        """fixed(node): whether node depends on nothing but the position and constants (its value at a
        position is kept, also while a probe replaces an activation)."""
        self.consts, self.pos_node, self.fixed = consts, pos_node, fixed
        self.memo: dict[tuple, object] = {}
        self.on_cpu: dict = {}

    def value(self, node, pos: int, subst: dict | None = None, wide: bool = False):
        """node's value at `pos`; `subst` replaces some nodes' values (a probe's input vector). wide:
        casts to 16-bit floats keep fp32 (a probe compares with fp32 arithmetic, not the model's rounding)."""
        if isinstance(node, (list, tuple)):
            return type(node)(self.value(a, pos, subst, wide) for a in node)
        if not isinstance(node, fx.Node):
            return node
        if subst is not None and node in subst:
            return subst[node]
        keep = subst is None or self.fixed(node)
        key = (pos, node, wide)
        if keep and key in self.memo:
            return self.memo[key]
        if node is self.pos_node:
            v = torch.tensor(pos, dtype=torch.int64)
        elif node in self.consts:
            v = self.consts[node]
            if isinstance(v, torch.Tensor) and v.device.type != "cpu":
                # (a model on a GPU: its position tables probed on the CPU, with the probes' own vectors)
                v = self.on_cpu.setdefault(node, v.cpu())
        elif node.op == "call_function":
            if node.target is torch.ops.aten.type_as.default and isinstance(node.args[1], fx.Node) and \
                    isinstance(node.args[1].meta.get("val"), torch.Tensor):
                # (its second argument gives a dtype alone: NanoChat's norm(x.float()).type_as(x))
                args = [self.value(node.args[0], pos, subst, wide),
                        torch.empty((), dtype=node.args[1].meta["val"].dtype)]
            else:
                args = [self.value(a, pos, subst, wide) for a in node.args]
            kwargs = {k: self.value(a, pos, subst, wide) for k, a in node.kwargs.items()}
            if "device" in kwargs:      # (a model on a GPU: what its graph creates there, made on the CPU)
                kwargs["device"] = torch.device("cpu")
            name = getattr(node.target, "__name__", str(node.target))
            if name.split(".")[0].endswith("_") and args and isinstance(args[0], torch.Tensor):
                args[0] = args[0].clone()           # in place on a private copy: the graph's constants stay
            v = node.target(*args, **kwargs)
            if isinstance(v, torch.Tensor) and v.device.type != "cpu":
                v = v.cpu()
            if wide and isinstance(v, torch.Tensor) and v.dtype in (torch.float16, torch.bfloat16):
                v = _widened(node, args, kwargs, v)
        else:
            raise ValueError(f"cannot evaluate {node.op} {node.name}")
        if keep:
            self.memo[key] = v
        return v


def _widened(node, args, kwargs, v):
    """A 16-bit result computed again in fp32: a cast keeps its fp32 input, other ops get fp32 inputs."""
    if "to" in str(node.target) or "type_as" in str(node.target):
        src = args[0]
        return src.float() if src.is_floating_point() and src.dtype not in (torch.float16, torch.bfloat16) else v.float()
    wide = [a.float() if isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) else a for a in args]
    return node.target(*wide, **kwargs).float()


def probe_positions(max_pos: int) -> list[int]:
    """Positions a position-dependent sub-graph is checked at: the first ones, a middle one, the last."""
    return sorted({p for p in (0, 1, 2, 3, 17, max_pos // 2, max_pos - 1) if 0 <= p < max_pos})


@dataclass
class Rope:
    """y = rotation of x by pos * inv_freq[j] per pair, times `scale`; `pairing` "interleaved" (pairs
    (2j, 2j+1)) or "half" (pairs (j, j + rot/2) over a head's first `rotary` dims (0: all of them), the
    rotate-half form; the dims after them in pairs (2j, 2j+1) of frequency 0: a partial rotary embedding)."""
    head_dim: int
    pairing: str
    inv_freq: list[float]
    scale: float
    rotary: int = 0


def _pairs(hd: int, pairing: str, rotary: int = 0):
    j = torch.arange(hd // 2)
    if pairing == "interleaved":
        return (2 * j, 2 * j + 1)
    rot = rotary or hd
    a = torch.where(j < rot // 2, j, 2 * j)
    b = torch.where(j < rot // 2, j + rot // 2, 2 * j + 1)
    return a, b


def _rotated_dims(block: torch.Tensor) -> int:
    """The leading dims a rotation moves at position 1: those before the trailing ones it leaves alone (even)."""
    hd = block.shape[0]
    eye = torch.eye(hd, dtype=block.dtype)
    rot = hd
    while rot > 0 and torch.allclose(block[:, rot - 1], eye[:, rot - 1], atol=1e-6, rtol=0):
        rot -= 1
    return rot + rot % 2


def rope_apply(x: torch.Tensor, r: Rope, pos: int) -> torch.Tensor:
    """The hypothesis: x [n] (heads of head_dim) rotated as `r` says, in float64."""
    x = x.double().reshape(-1, r.head_dim)
    a, b = _pairs(r.head_dim, r.pairing, r.rotary)
    ang = pos * torch.tensor(r.inv_freq, dtype=torch.float64)
    c, s = torch.cos(ang) * r.scale, torch.sin(ang) * r.scale
    y = torch.empty_like(x)
    y[:, a] = x[:, a] * c - x[:, b] * s
    y[:, b] = x[:, a] * s + x[:, b] * c
    return y.reshape(-1)


@torch.no_grad()
def probe_rope(f, n: int, head_dim: int, max_pos: int) -> Rope | None:
    """The rotation f(x [n], pos) -> [n] applies, if it is RoPE of some pairing, frequencies and
    amplitude for every head at every probed position (within fp32 rounding); else None."""
    hd = head_dim
    if hd % 2 or n % hd:
        return None
    # one column of each head's block per evaluation: unit vector i in every head at once
    block = torch.zeros(hd, hd, dtype=torch.float64)
    for i in range(hd):
        x = torch.zeros(n)
        x[i::hd] = 1.0
        block[:, i] = f(x, 1).double().reshape(-1, hd)[0]
    far = max(max_pos - 1, 1)
    rot = _rotated_dims(block)
    tries = [("interleaved", 0), ("half", 0)] + ([("half", rot)] if 0 < rot < hd else [])
    for pairing, rotary in tries:
        a, b = _pairs(hd, pairing, rotary)
        c1, s1 = block[a, a], block[b, a]
        scale = float(torch.sqrt(c1 ** 2 + s1 ** 2).mean())
        if scale <= 0:
            continue
        coarse = torch.atan2(s1, c1)            # the angle at pos 1: the frequency, up to 2 pi
        # refined at the farthest position (rounding of the angle at pos 1 grows with pos otherwise)
        cols = []
        for j in range(hd // 2):
            x = torch.zeros(n)
            x[int(a[j])::hd] = 1.0
            cols.append(f(x, far).double().reshape(-1, hd)[0])
        cf = torch.stack([cols[j][a[j]] for j in range(hd // 2)])
        sf = torch.stack([cols[j][b[j]] for j in range(hd // 2)])
        ang_far = torch.atan2(sf, cf)
        turns = torch.round((coarse * far - ang_far) / (2 * math.pi))
        freq = (ang_far + 2 * math.pi * turns) / far
        r = Rope(hd, pairing, [float(v) for v in freq], scale, rotary)
        if _holds(f, r, n, max_pos):
            return r
    return None


# activation functions a region of elementwise ops may compute (GPT-2's and Phi-2's "gelu_new" written out)
# (each matched against the IR's own definition: kogc.ir.executor.RUNNERS)
ACTIVATIONS = {"gelu_tanh": Op.GELU_TANH, "gelu": Op.GELU, "silu": Op.SILU}


def probe_activation(f, n: int, max_pos: int) -> str | None:
    """The activation (a key of ACTIVATIONS) f(x [n], pos) -> [n] computes elementwise at every probed position,
    on inputs from -8 to 8 (within fp32 rounding); else None."""
    gen = torch.Generator().manual_seed(0)
    xs = [torch.linspace(-8.0, 8.0, n), torch.randn(n, generator=gen) * 3]
    try:
        got = [[f(x, pos).double() for x in xs] for pos in probe_positions(max_pos)]
    except (RuntimeError, ValueError):
        return None
    for name, op in ACTIVATIONS.items():
        want = [RUNNERS[op](None, [x.double()], None) for x in xs]
        if all(g.shape == w.shape and torch.allclose(g, w, rtol=1e-5, atol=1e-6)
               for at in got for g, w in zip(at, want)):
            return name
    return None


def probe_xielu(f, n: int, max_pos: int) -> dict | None:
    """The constants of xIELU (kogc.ir.executor.xielu: Apertus's activation, each layer's own) where f computes it
    at every probed position, else None: alpha_p and beta from f at 1 and 2, alpha_n from f at -1, eps from f at 0,
    then checked on inputs from -8 to 8 (within fp32 rounding)."""
    x = torch.zeros(n)
    x[:4] = torch.tensor([1.0, 2.0, -1.0, 0.0])
    try:
        f1, f2, fm1, f0 = f(x, 0).double()[:4].tolist()
    except (RuntimeError, ValueError):
        return None
    alpha_p = (f2 - 2 * f1) / 2
    beta = f1 - alpha_p
    alpha_n = (fm1 + beta) / math.exp(-1.0)      # f(-1) = (expm1(-1) + 1) alpha_n - beta
    if not alpha_n or not -1 < f0 / alpha_n < 0:
        return None
    attrs = {"alpha_p": alpha_p, "alpha_n": alpha_n, "beta": beta, "eps": math.log1p(f0 / alpha_n)}
    gen = torch.Generator().manual_seed(0)
    xs = [torch.linspace(-8.0, 8.0, n), torch.randn(n, generator=gen) * 3]
    try:
        ok = all(torch.allclose(f(x, pos).double(), xielu(x, attrs).double(), rtol=1e-5, atol=1e-6)
                 for pos in probe_positions(max_pos) for x in xs)
    except (RuntimeError, ValueError):
        return None
    return attrs if ok else None


def _holds(f, r: Rope, n: int, max_pos: int) -> bool:
    gen = torch.Generator().manual_seed(0)
    for pos in probe_positions(max_pos):
        x = torch.randn(n, generator=gen)
        want = rope_apply(x, r, pos)
        got = f(x, pos).double().reshape(-1)
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max())):
            return False
    return True


def causal_allowed(mask: torch.Tensor, additive: bool) -> torch.Tensor:
    """Which positions a mask lets through: True entries of a boolean mask, zeros of an additive one.
    An additive mask's other entries must be large and negative (-inf or the dtype's minimum)."""
    if not additive:
        return mask.bool()
    m = mask.float()
    if not bool(((m == 0) | (m <= -1e4)).all()):
        raise ValueError("an additive attention mask with entries other than 0 and a large negative value")
    return m == 0


def attended_from(allowed: torch.Tensor, pos: int) -> int | None:
    """The first position every row of `allowed` (broadcast over heads, last axis the cache) attends, where
    each row is one run lo..pos; None for any other shape."""
    S = allowed.shape[-1]
    rows = allowed.reshape(-1, S)
    idx = torch.arange(S)
    lo = int(idx[rows[0]].min()) if bool(rows[0].any()) else pos + 1
    want = (idx >= lo) & (idx <= pos)
    return lo if lo <= pos and bool((rows == want).all()) else None


def alibi_of(bias: torch.Tensor) -> dict | None:
    """{"slopes": [per head], "at": c} where bias [heads, positions] (fp32) is exactly slope_h * (k + c) as fp32
    computes it (BLOOM's c = 0, MPT's key positions counted back from the cache's last), else None. c is where
    the first head's bias is 0; each slope is the bias one position from there."""
    heads, positions = bias.shape
    zeros = (bias[0] == 0).nonzero().flatten().tolist()
    if len(zeros) != 1 or positions < 2:
        return None
    k0 = zeros[0]
    slopes = bias[:, k0 + 1] if k0 + 1 < positions else -bias[:, k0 - 1]
    c = -k0
    again = slopes[:, None] * (torch.arange(positions) + c).to(torch.float32)[None, :]
    if not torch.equal(again, bias) or not bool((slopes > 0).all()):
        return None
    return {"slopes": [float(s) for s in slopes], "at": c}


def window_of(allowed_at, max_pos: int) -> int | None:
    """The window of a causal mask: 0 where position p attends 0..p at every probed position (plain
    causal, or a window the cache never exceeds), W where it attends max(0, p - W + 1)..p (a sliding
    window of W positions: Mistral's, Gemma 3's local layers); None for any other mask. `allowed_at(p)`
    is the mask's allowed positions at p; the window found is checked again on both sides of its edge."""
    firsts = {p: attended_from(allowed_at(p), p) for p in probe_positions(max_pos)}
    if None in firsts.values():
        return None
    widths = {p - lo + 1 for p, lo in firsts.items() if lo > 0}
    if len(widths) > 1:
        return None
    window = widths.pop() if widths else 0
    for p in (window - 1, window, window + 1) if window else ():
        if 0 <= p < max_pos and p not in firsts:
            firsts[p] = attended_from(allowed_at(p), p)
    ok = all(lo == (max(0, p - window + 1) if window else 0) for p, lo in firsts.items())
    return window if ok else None

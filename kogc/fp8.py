"""FP8 weights: E4M3 values with one fp32 scale per output row, as the kernel streams them.

A matvec weight W [..., rows, K] is stored as q = round_fp8(W / s) with s = max|W[row]| / FMAX per row,
so that W ~ q * s[:, None]. The kernel converts q to fp32 in registers, accumulates q . x in fp32 and
multiplies each row's sum by its scale. Per row was measured against per block of rows x 128 inputs on
SmolLM2-135M-Instruct (docs/fp8.md): blocks were no better (perplexity +3.01% against +2.40%), so the
kernel has rows only.

NVIDIA (sm_90) streams E4M3FN (max 448); AMD gfx942 E4M3FNUZ (max 240, its exponent bias one higher).
An FN value halved is exactly an FNUZ value, so weights quantized or stored as FN are converted at
packing by halving q and doubling s, with no rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import KogcError

FORMATS = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
TRITON_TYPES = {"e4m3fn": "fp8e4nv", "e4m3fnuz": "fp8e4b8"}   # Triton's names (signatures)
WEIGHT_FORMATS = ("model", "fp8")    # TileConfig.weights: as the model stores them, or FP8 + row scales
SCALE_SUFFIXES = ("_scale", ".scale", "_scale_inv")   # a pre-quantized weight's scale in a state dict


@dataclass(frozen=True)
class Fp8Weight:
    """A weight already in FP8: `q` [..., rows, K] (float8_e4m3fn or _e4m3fnuz) and `scale` [..., rows]
    fp32, the weight being q * scale[..., None]. `keep`: where the model reads the same tensor in its own
    dtype (a tied embedding), these values instead of the dequantized ones (compensated rounding fits the
    FP8 values to the matvec's inputs alone); None: the dequantized ones."""
    q: torch.Tensor
    scale: torch.Tensor
    keep: torch.Tensor | None = None

    def __post_init__(self):
        if self.q.dtype not in FORMATS.values():
            raise KogcError(f"an FP8 weight must be float8_e4m3fn or float8_e4m3fnuz, got {self.q.dtype}")
        if tuple(self.scale.shape) != tuple(self.q.shape[:-1]):
            raise KogcError(f"an FP8 weight of shape {tuple(self.q.shape)} needs one scale per row, shape "
                            f"{tuple(self.q.shape[:-1])}; got {tuple(self.scale.shape)}")

    @property
    def shape(self):
        return self.q.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.q.float() * self.scale.float()[..., None]).to(dtype)

    def read_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The tensor where the model reads it in its own dtype: `keep`, else the dequantized values."""
        return (self.keep if self.keep is not None else self.dequantize()).to(dtype)

    def to_format(self, fmt: str) -> "Fp8Weight":
        """The same values in `fmt`: FN -> FNUZ halves q and doubles the scale (exact)."""
        want = FORMATS[fmt]
        if self.q.dtype == want:
            return self
        if want == torch.float8_e4m3fnuz:
            return Fp8Weight((self.q.float() / 2).to(want), self.scale.float() * 2, self.keep)
        return Fp8Weight((self.q.float() * 2).to(want), self.scale.float() / 2, self.keep)   # FNUZ -> FN: exact too


QUANTIZE_CHUNK = 1 << 22     # elements widened to fp32 at a time: a chunk's passes stay in the caches


def quantize(w: torch.Tensor, fmt: str = "e4m3fn") -> Fp8Weight:
    """Round `w` [..., rows, K] to FP8 with one fp32 scale per row (the largest magnitude maps to the
    format's largest value; a row of zeros gets scale 1). In chunks of rows, in place: the same values as
    one pass over the whole widened tensor, several times faster on large weights (packing a 7B model)."""
    dtype = FORMATS[fmt]
    big = torch.finfo(dtype).max
    rows = w.detach().reshape(-1, w.shape[-1])
    q = torch.empty(rows.shape, dtype=dtype, device=w.device)
    scale = torch.empty(rows.shape[0], dtype=torch.float32, device=w.device)
    step = max(1, QUANTIZE_CHUNK // max(rows.shape[1], 1))
    for r in range(0, rows.shape[0], step):
        wf = rows[r:r + step].to(torch.float32, copy=True)      # (a copy even of fp32: divided in place)
        s = _row_scales(wf, dtype)
        scale[r:r + step] = s
        q[r:r + step] = wf.div_(s[:, None]).clamp_(-big, big)
    return Fp8Weight(q.reshape(w.shape), scale.reshape(w.shape[:-1]))


def _row_scales(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One scale per row, in w's precision: the row's largest magnitude maps to the format's largest
    value; a row of zeros gets 1."""
    lo, hi = w.aminmax(dim=-1)          # (no |w| copy)
    amax = torch.maximum(-lo, hi)
    return torch.where(amax > 0, amax / torch.finfo(dtype).max, torch.ones_like(amax))


def quantize_compensated(w: torch.Tensor, hessian: torch.Tensor, fmt: str = "e4m3fn", damp: float = 0.01,
                         block: int = 64) -> Fp8Weight:
    """`w` [rows, K] to FP8 with the same per-row scales as `quantize`, each input's rounding error pushed
    onto the inputs not yet rounded so that the layer's output error over calibration inputs is least
    (GPTQ: Frantar et al., 2022). `hessian` [K, K] is the sum of x x^T over those inputs; `damp` times
    its mean diagonal is added for stability; inputs that never occur are zeroed. The kernel is
    unchanged: it streams these values as any FP8 weight."""
    dtype = FORMATS[fmt]
    fmax = torch.finfo(dtype).max
    W = w.detach().double().clone()
    h = hessian.detach().double().clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    W[:, dead] = 0.0
    h += damp * torch.diag(h).mean() * torch.eye(h.shape[0], dtype=h.dtype)
    # the upper Cholesky factor of h^-1: row i holds how input i's error spreads to the inputs after it
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    scale = _row_scales(w.detach().double(), dtype)
    q = torch.zeros(W.shape, dtype=dtype)
    K = W.shape[1]
    for i0 in range(0, K, block):
        i1 = min(K, i0 + block)
        Wb, err, hb = W[:, i0:i1].clone(), torch.zeros(W.shape[0], i1 - i0, dtype=W.dtype), hinv[i0:i1, i0:i1]
        for j in range(i1 - i0):
            qj = (Wb[:, j] / scale).clamp(-fmax, fmax).to(dtype)
            q[:, i0 + j] = qj
            e = (Wb[:, j] - qj.double() * scale) / hb[j, j]
            Wb[:, j:] -= e[:, None] * hb[j, j:][None, :]
            err[:, j] = e
        W[:, i1:] -= err @ hinv[i0:i1, i1:]
    return Fp8Weight(q, scale.float())


# prompts whose greedy answers calibrate compensated rounding (none of the text the quality is measured on)
CALIBRATION_PROMPTS = ("Tell me about the history of Rome.", "Explain how a computer works.",
                       "Write a short story about a dog.", "What are the benefits of exercise?",
                       "Describe the water cycle.", "How do airplanes fly?", "Give advice to a new student.",
                       "What is photosynthesis?")


@torch.no_grad()
def calibration_text(model, tok, new_tokens: int = 160) -> list[torch.Tensor]:
    """A transformers model's greedy answers to CALIBRATION_PROMPTS with its tokenizer `tok` (prompt and
    answer token ids, [1, n] each)."""
    out = []
    for p in CALIBRATION_PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        out.append(model.generate(**ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.eos_token_id))
    return out


@torch.no_grad()
def compensate_head(model, calibration: list[torch.Tensor]) -> dict[str, Fp8Weight]:
    """The LM head of a transformers causal LM in FP8 by quantize_compensated, its inputs' second moments
    gathered over `calibration` (token id tensors [1, n]: text like the model's use, e.g. its own answers
    to a few prompts, calibration_text), by the head's parameter name in `model`: give it
    to kogc.compile(model, weights=...). The other matvec weights are rounded when packed, as with
    weights="fp8"; a tied embedding keeps its values (`keep`). SmolLM2-135M-Instruct: perplexity
    +1.62% against +2.40% for plain rounding (docs/fp8.md)."""
    head = model.get_output_embeddings()
    name = next(m for m, mod in model.named_modules() if mod is head) + ".weight"
    k = head.weight.shape[1]
    hess = torch.zeros(k, k, dtype=torch.float64)

    def gather(mod, inp, out):
        x = inp[0].reshape(-1, k).double()
        hess.add_(x.T @ x)
    hook = head.register_forward_hook(gather)
    try:
        for ids in calibration:
            model(input_ids=ids)
    finally:
        hook.remove()
    w = quantize_compensated(head.weight.detach().float(), hess)
    return {name: Fp8Weight(w.q, w.scale, keep=head.weight.detach().clone())}


def quantize_blocks(w: torch.Tensor, block: int = 128, fmt: str = "e4m3fn") -> torch.Tensor:
    """The values `w` takes with one scale per row x `block` inputs (dequantized, fp32): the finer
    alternative the quality measurement compares per-row scales with."""
    K = w.shape[-1]
    pad = (-K) % block
    wf = torch.nn.functional.pad(w.detach().float(), (0, pad)).reshape(*w.shape[:-1], -1, block)
    return quantize(wf, fmt).dequantize().reshape(*w.shape[:-1], K + pad)[..., :K]


def fake_quantize(w: torch.Tensor, fmt: str = "e4m3fn") -> torch.Tensor:
    """`w` as the kernel sees it after FP8 packing, in w's dtype (for references and quality checks)."""
    return quantize(w, fmt).dequantize(w.dtype)


def from_state_dict(state: dict) -> dict[str, Fp8Weight]:
    """The pre-quantized weights of a state dict: each float8 tensor with its per-row scale stored beside
    it as NAME_scale (or NAME.scale; NAME_scale_inv as in DeepSeek-style checkpoints, where it also
    multiplies), [rows] or [rows, 1]."""
    out = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor) or t.dtype not in FORMATS.values():
            continue
        scale = next((state[name + s] for s in SCALE_SUFFIXES if name + s in state), None)
        if scale is None:
            raise KogcError(f"FP8 tensor {name} has no scale beside it (looked for "
                            f"{', '.join(name + s for s in SCALE_SUFFIXES)})")
        if scale.dim() == t.dim() and scale.shape[-1] == 1:
            scale = scale[..., 0]
        if tuple(scale.shape) != tuple(t.shape[:-1]):
            raise KogcError(f"FP8 tensor {name} {tuple(t.shape)}: its scale has shape {tuple(scale.shape)}; kogc "
                            f"takes one scale per row ({tuple(t.shape[:-1])}), not per block")
        out[name] = Fp8Weight(t, scale.float())
    return out


def matvec_params(graph) -> set[str]:
    """The IR names of the PARAMs the kernel streams as matvec weights (what FP8 quantizes)."""
    from .ir.graph import Op
    by = graph.by_name()
    return {by[n.inputs[0]].attrs["name"] for n in graph.nodes if n.op is Op.MATVEC}


def fake_quantize_module(module: torch.nn.Module, graph, fmt: str = "e4m3fn") -> list[str]:
    """Give `module` the weights an FP8 kernel of `graph` computes with: each matvec weight, as the IR
    views it (rows as the kernel tiles them), quantized per row and written back through the view
    (in place). The eager reference of `kogc check --weights fp8`. Returns the parameters changed; a
    parameter that is also read unquantized (a tied embedding) is refused: no eager module holds both."""
    from .ir.views import derive_step
    from .ir.graph import Op
    params = named_tensors(module)
    quantized = matvec_params(graph)
    sources = {}
    for n in graph.nodes:
        if n.op is Op.PARAM:
            sources.setdefault(n.attrs.get("source", n.attrs["name"]), []).append(n)
    changed = []
    for source, nodes in sources.items():
        mine = [n for n in nodes if n.attrs["name"] in quantized]
        if not mine:
            continue
        if len(mine) != len(nodes) or len(same_tensor(params, source)) > 1:
            raise KogcError(f"{source} is a matvec weight (quantized to FP8) and also read as it is (a tied "
                            f"embedding?): an eager module cannot hold both; compare with the IR reference instead")
        t = params[source]
        for n in mine:
            steps = n.attrs.get("view", ())
            view, idx = t.detach(), torch.arange(t.numel()).reshape(t.shape)
            for step in steps:
                view, idx = derive_step(view, step), derive_step(idx, step)
            with torch.no_grad():
                t.view(-1)[idx.reshape(-1)] = fake_quantize(view, fmt).reshape(-1).to(t.dtype)
        changed.append(source)
    return changed


def named_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of `module` by every name it has (a tied weight under each)."""
    params = dict(module.named_parameters(remove_duplicate=False))
    params.update(dict(module.named_buffers(remove_duplicate=False)))
    return params


def same_tensor(params: dict, name: str) -> list[str]:
    """Every name of `params` (named_tensors) holding the tensor of `name`:
    more than one for tied weights."""
    return [k for k, t in params.items() if t is params[name]]

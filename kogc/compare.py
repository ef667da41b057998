"""How kogc's logits and tokens are compared with a reference's (eager PyTorch's, or another kernel's).

Tie-aware argmax: eager fp16 is one rounding of the model among several valid ones. Where eager's
top two logits are within a couple of fp16 steps of each other, either token is a correct answer,
and a different choice there is no error. `tie_aware_mismatches` counts a miss only where the logit
eager gives kogc's token is more than `ulps` fp16 steps (the spacing of fp16 at the magnitude of
eager's maximum) below eager's maximum: in particular every step where eager's own top two are more
than that apart and kogc did not pick eager's token.
"""
from __future__ import annotations

import torch

TIE_ULPS = 2.0            # a miss counts only when kogc's token is more than this many fp16 steps below eager's max
FP32_SLACK = 0.10         # kogc's mean error against fp32 may exceed eager's by this fraction ...
FP32_FLOOR = 1e-6         # ... plus this (an fp32 model's eager is its own fp32 reference: error 0)


def fp16_ulp(x, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """The spacing of `dtype` (one step, an ulp) at the magnitude of `x`: 2**(floor(log2|x|)) * eps,
    never below the spacing of the subnormals (2**-24 for fp16)."""
    fi = torch.finfo(dtype)
    x = torch.as_tensor(x, dtype=torch.float64).abs()
    e = torch.floor(torch.log2(x.clamp(min=fi.tiny)))
    return torch.exp2(e) * fi.eps


def token_miss(ref: torch.Tensor, token: int, ulps: float, dtype: torch.dtype) -> dict | None:
    """None if `token` is eager's choice or within `ulps` steps of it in `ref` (eager's logits)."""
    ref = ref.detach().reshape(-1).double().cpu()
    top2 = torch.topk(ref, min(2, ref.numel()))
    best = int(torch.argmax(ref))                     # the first maximum: greedy's tie rule
    if token == best:
        return None
    unit = float(fp16_ulp(ref[best], dtype))
    top2_gap = float(top2.values[0] - top2.values[-1])
    gap = float(ref[best] - ref[token]) if 0 <= token < ref.numel() else float("inf")
    if gap <= ulps * unit:
        return None
    return {"kogc": int(token), "eager": best, "gap": gap, "gap_ulps": gap / unit, "top2_gap": top2_gap,
            "ulp": unit}


def tie_aware_mismatches(eager_logits, kogc_tokens, ulps: float = TIE_ULPS,
                         dtype: torch.dtype = torch.float16) -> list[dict]:
    """The steps where kogc's token is a real miss against eager's logits.

    eager_logits: [steps, vocab] (a tensor or a sequence of 1-D tensors), kogc_tokens: one token per
    step. A step counts when kogc's token differs from eager's argmax AND eager's logit for it is more
    than `ulps` steps of `dtype` (at the magnitude of eager's maximum) below that maximum; a token
    outside the vocabulary always counts. Returns one dict per miss: step, kogc, eager, gap (eager's
    max minus eager's logit of kogc's token), gap_ulps, top2_gap (eager's own top-two gap), ulp."""
    rows = list(eager_logits)
    tokens = [int(t) for t in kogc_tokens]
    if len(rows) != len(tokens):
        raise ValueError(f"{len(rows)} rows of logits for {len(tokens)} tokens")
    out = []
    for step, (ref, tok) in enumerate(zip(rows, tokens)):
        m = token_miss(ref, tok, ulps, dtype)
        if m is not None:
            out.append({"step": step, **m})
    return out


def is_near_tie(ref: torch.Tensor, ulps: float = TIE_ULPS, dtype: torch.dtype = torch.float16) -> bool:
    """Eager's own top two logits are at most `ulps` steps of `dtype` apart."""
    ref = ref.detach().reshape(-1).double().cpu()
    if ref.numel() < 2:
        return False
    top = torch.topk(ref, 2).values
    return bool(top[0] - top[1] <= ulps * fp16_ulp(top[0], dtype))


def no_farther_than_eager(kogc_err: float, eager_err: float, slack: float = FP32_SLACK,
                          floor: float = FP32_FLOOR) -> bool:
    """kogc's error against the fp32 reference is at most eager's, with `slack` (relative) and
    `floor` (absolute) to spare."""
    return kogc_err <= eager_err * (1.0 + slack) + floor


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def tie_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """Whose steps measure a tie: bf16's for a bf16 model, fp16's otherwise (fp32 models included)."""
    return torch.bfloat16 if model_dtype == torch.bfloat16 else torch.float16


def default_max_rel_err(model_dtype: torch.dtype) -> float:
    """fp32 1e-4, fp16 1e-2, bf16 8e-2: fp16's scaled by the dtype's epsilon (bf16's is 8 times fp16's; a bf16
    SmolLM2-135M's shapes measured 2.3e-2 on the H200)."""
    return {torch.float32: 1e-4, torch.bfloat16: 8e-2}.get(model_dtype, 1e-2)

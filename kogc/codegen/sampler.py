"""The monokernel's sampling code as a kernel of its own: draws from fixed logits (tests, checks)."""
from __future__ import annotations

import torch

from ..scheduler.tasks import HIST_BINS, HIST_WORDS, TOKEN_KEYS
from .loader import interpreter, load_kernel
from .render import _ENV


def sampler_source() -> str:
    """The sampler's Python source: the monokernel's sampling code (sampling.j2, with the kernel's sizes) and the
    kernels that run it alone; probes append theirs."""
    return _ENV.get_template("sampler.py.j2").render(hist_bins=HIST_BINS, token_keys=TOKEN_KEYS, hist_words=HIST_WORDS)


def _run(name: str, logits: torch.Tensor, out: torch.Tensor, interpret: bool | None, *args) -> None:
    """One program of the sampler source's kernel `name` over `logits` (blocks of up to 1,024)."""
    if interpret is None:
        interpret = not logits.is_cuda
    kernel, _ = load_kernel(sampler_source(), interpret, name=name)
    V = logits.numel()
    hist = torch.zeros(HIST_WORDS, dtype=torch.int32, device=logits.device)    # counts per 16-bit key (HIST)
    with interpreter(interpret):
        kernel[(1,)](logits.contiguous(), out, hist, V, *args, BLOCK=min(1024, 1 << max(0, (V - 1).bit_length())))
    if hist.any():
        raise RuntimeError("the sampler left counts in its histogram: the next draw would count them")


def sample_tokens(logits: torch.Tensor, n: int, seed: int = 0, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, interpret: bool | None = None) -> torch.Tensor:
    """n draws (one per step 0..n-1) with the same code and random numbers as generation."""
    out = torch.zeros(n, dtype=torch.int32, device=logits.device)
    _run("kogc_sampler", logits, out, interpret, n, seed, float(temperature), int(top_k), float(top_p))
    return out


def filter_threshold(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     interpret: bool | None = None) -> float:
    """The smallest logit that top-k / top-p sampling keeps, as the kernel finds it (fp16 or fp32 logits)."""
    out = torch.zeros(1, dtype=torch.int64, device=logits.device)
    _run("kogc_filter_threshold", logits, out, interpret, float(temperature), int(top_k), float(top_p))
    b = int(out.item())          # the order key back to the float (_order_key flips negative magnitudes)
    if logits.dtype in (torch.float16, torch.bfloat16):       # 16-bit keys
        b = b if b >= 0 else b ^ 0x7FFF
        return float(torch.tensor([b], dtype=torch.int16).view(logits.dtype))
    b = b if b >= 0 else b ^ 0x7FFFFFFF
    return float(torch.tensor([b], dtype=torch.int32).view(torch.float32))

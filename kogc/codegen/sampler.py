"""The monokernel's sampling code as a kernel of its own: draws from fixed logits (tests, checks)."""
from __future__ import annotations

import torch

from .loader import interpreter, load_kernel
from .render import _ENV


def sample_tokens(logits: torch.Tensor, n: int, seed: int = 0, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, interpret: bool | None = None) -> torch.Tensor:
    """n draws (one per step 0..n-1) with the same code and random numbers as generation."""
    if interpret is None:
        interpret = not logits.is_cuda
    source = _ENV.get_template("sampler.py.j2").render()
    kernel, _ = load_kernel(source, interpret, name="kogc_sampler")
    out = torch.zeros(n, dtype=torch.int32, device=logits.device)
    V = logits.numel()
    block = min(1024, 1 << max(0, (V - 1).bit_length()))
    with interpreter(interpret):
        kernel[(1,)](logits.contiguous(), out, V, n, seed, float(temperature), int(top_k), float(top_p), BLOCK=block)
    return out


def filter_threshold(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     interpret: bool | None = None, block: int | None = None) -> float:
    """The smallest logit that top-k / top-p sampling keeps, as the kernel finds it (fp32)."""
    if interpret is None:
        interpret = not logits.is_cuda
    source = _ENV.get_template("sampler.py.j2").render()
    kernel, _ = load_kernel(source, interpret, name="kogc_filter_threshold")
    out = torch.zeros(1, dtype=torch.int64, device=logits.device)
    V = logits.numel()
    block = block or min(1024, 1 << max(0, (V - 1).bit_length()))
    with interpreter(interpret):
        kernel[(1,)](logits.contiguous(), out, V, float(temperature), int(top_k), float(top_p), BLOCK=block)
    b = int(out.item())          # the order key back to the float (_order_key flips negative magnitudes)
    b = b if b >= 0 else b ^ 0x7FFFFFFF
    return float(torch.tensor([b], dtype=torch.int32).view(torch.float32))

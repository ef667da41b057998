"""Timing and byte counting for the benchmark."""
from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..errors import KogcError
from ..scheduler.config import ESIZE


@dataclass
class Row:
    name: str
    ms: list[float]                       # ms per token, one figure per repetition
    error: str | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self, floor_bytes: int) -> dict:
        if not self.ms:
            return {"name": self.name, "error": self.error}
        med = statistics.median(self.ms)
        floor_bytes = self.extra.get("floor_bytes", floor_bytes)     # a row with its own bytes per token
        return {"name": self.name, "ms_median": med, "ms_min": min(self.ms), "ms_max": max(self.ms),
                "ms_reps": self.ms, "tok_per_s": 1e3 / med, "TBps": floor_bytes / (med * 1e-3) / 1e12, **self.extra}


def check_timing(contexts: list[int], steps: int, reps: int) -> None:
    """The positions and counts a timed run takes (bench, its scaling table and ranks, sweep): a KogcError otherwise."""
    if not contexts or any(c < 0 for c in contexts):
        raise KogcError(f"--context must be one or more positions >= 0, got {contexts}")
    if steps < 1 or reps < 1:
        raise KogcError("--steps and --reps must be >= 1")


def time_steps(run, steps: int, reps: int, device: str, warmup: int = 3) -> list[float]:
    """ms per step of `run(i)` over `steps` consecutive calls, `reps` times (device events on GPU)."""
    for i in range(warmup):
        run(i)
    out = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for i in range(steps):
                run(i)
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b) / steps)
        else:
            t0 = time.perf_counter()
            for i in range(steps):
                run(i)
            out.append((time.perf_counter() - t0) * 1e3 / steps)
    return out


def read_bandwidth(gib: int = 2, reps: int = 20, warm_s: float = 0.3) -> float:
    """HBM read bandwidth in bytes/s: a reduction over `gib` GiB of random fp16 (median of reps),
    after `warm_s` seconds of the same reduction. One lent machine read 3.89 TB/s at the start of
    one run and 4.12-4.19 TB/s in the runs around it (2026-11-30); the floor, and every "of floor"
    figure, moved with it. Warming first (an idle GPU's clocks are low) and twice the reps read
    4.191 TB/s twice in a row there."""
    x = torch.randn(gib * 2**29, device="cuda", dtype=torch.float16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:
        x.sum(dtype=torch.float32)
        torch.cuda.synchronize()
    ms = time_steps(lambda i: x.sum(dtype=torch.float32), 1, reps, "cuda", warmup=1)
    x = None   # free the 2 GiB before the caller allocates
    torch.cuda.empty_cache()
    return gib * 2**30 / (statistics.median(ms) * 1e-3)


def bytes_per_token(ck, pos: int, as_model: bool = False) -> int:
    """What one decode step must read: every streamed weight, one embedding row, the norm scales,
    and the KV cache up to `pos` (keys and values of every layer and lane; a sliding window's last W). The weights as the kernel
    stores them (FP8 with their scales), or `as_model`: in the model's dtype, what a stack that streams
    the model's own weights (a baseline beside an FP8 kernel) must read."""
    es = ESIZE[ck.schedule.dtype]
    if as_model:
        weights = sum(t.weight.numel for t in ck.schedule.tasks if t.weight) * es
    else:
        weights = sum(ck.schedule.weight_bytes_per_program())
    emb_row = ck.buffers.EMB.shape[-1] * es if ck.buffers.EMB.dim() == 2 else 0
    kv = 0
    for op in ck.schedule.ops:
        if op.kind == "attention":
            positions = min(pos + 1, op.p.get("window") or pos + 1)     # a sliding window reads its last W
            kv += 2 * max(op.lanes, 1) * op.p["kv_heads"] * positions * op.p["head_dim"] * es
    return weights + emb_row + ck.schedule.layout.sizes["small"] * es + kv


def kernel_id(ck) -> str:
    """The first 12 hex digits of the SHA-1 of the kernel's generated source: which kernel a result is of,
    whatever the checkout's git state (the source names the model in its first line)."""
    return hashlib.sha1(ck.source.encode()).hexdigest()[:12]

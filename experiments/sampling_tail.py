"""Probe (one NVIDIA GPU): what the top-k / top-p thresholds cost a token, the serial tail of a filtered draw.

The monokernel's sampling task finds, in one program of 4 warps, the smallest logit that top-k and top-p keep
(kogc/codegen/templates/sampling.j2, `_filter_threshold`), then draws by Gumbel-max over what is kept. Here
that search runs alone on one vector of logits of laneformer-2b's vocabulary (fp16, in blocks of 2,048 as
the kernel reads them), beside the bisection it replaced (one threshold a pass, a reduction across warps
every block; kept in this file), for a few settings. Each form's threshold is checked equal to the other's
and to torch's exact one (top-k); the time is the median of R launches (CUDA events), less an empty
launch's.

    PYTHONPATH=. python experiments/sampling_tail.py --out $OUT/sampling-tail.json
"""
import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from kogc.codegen.loader import load_kernel
from kogc.codegen.render import _ENV

VOCAB = 128256          # laneformer-2b's
BLOCK = 2048            # the sampling task's block (kogc.scheduler.tile: argmax)
SETTINGS = [dict(temperature=0.8, top_k=50, top_p=1.0), dict(temperature=0.8, top_k=0, top_p=0.9),
            dict(temperature=0.8, top_k=50, top_p=0.9), dict(temperature=1.0, top_k=1000, top_p=0.95)]


@triton.jit
def _key(x):
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def _count_ge(LOGITS, V, thr, BLOCK: tl.constexpr):
    c = tl.zeros((), tl.int64)
    b0 = 0
    while b0 < V:
        i = b0 + tl.arange(0, BLOCK)
        x = tl.load(LOGITS + i, mask=i < V, other=float("-inf")).to(tl.float32)
        c += tl.sum(((_key(x) >= thr) & (i < V)).to(tl.int64), 0)
        b0 += BLOCK
    return c


@triton.jit
def _mass_ge(LOGITS, V, thr, top, inv_t, BLOCK: tl.constexpr):
    m = tl.zeros((), tl.float32)
    b0 = 0
    while b0 < V:
        i = b0 + tl.arange(0, BLOCK)
        x = tl.load(LOGITS + i, mask=i < V, other=float("-inf")).to(tl.float32)
        keep = (_key(x) >= thr) & (i < V)
        m += tl.sum(tl.where(keep, tl.exp((x - top) * inv_t), 0.0), 0)
        b0 += BLOCK
    return m


@triton.jit(do_not_specialize=["V", "temperature", "top_k", "top_p"])
def bisection_threshold(LOGITS, OUT, V, temperature, top_k, top_p, BLOCK: tl.constexpr):
    """The search before: bisection over the float order, one threshold a pass."""
    inv_t = 1.0 / temperature
    top = float("-inf")
    lo = tl.full((), 2147483647, tl.int64)
    hi = tl.full((), -2147483648, tl.int64)
    b0 = 0
    while b0 < V:
        i = b0 + tl.arange(0, BLOCK)
        live = i < V
        x = tl.load(LOGITS + i, mask=live, other=float("-inf")).to(tl.float32)
        k = _key(x)
        top = tl.maximum(top, tl.max(x, 0))
        lo = tl.minimum(lo, tl.min(tl.where(live, k, 2147483647), 0))
        hi = tl.maximum(hi, tl.max(tl.where(live, k, -2147483648), 0))
        b0 += BLOCK
    kmax = hi
    if (top_k > 0) & (top_k < V):
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            enough = _count_ge(LOGITS, V, mid, BLOCK) >= top_k
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid - 1)
    if top_p < 1.0:
        need = top_p * _mass_ge(LOGITS, V, lo, top, inv_t, BLOCK)
        hi = kmax
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            enough = _mass_ge(LOGITS, V, mid, top, inv_t, BLOCK) >= need
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid - 1)
    tl.store(OUT, lo)


@triton.jit
def empty(OUT):
    tl.store(OUT, 0)


def timed(launch, reps: int) -> float:
    """Median microseconds of one launch."""
    launch()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        launch()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args()
    search, _ = load_kernel(_ENV.get_template("sampler.py.j2").render(), False, name="kogc_filter_threshold")
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(VOCAB, generator=g) * 2.5).half().cuda()
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    base = timed(lambda: empty[(1,)](out), a.reps)
    rows = []
    for s in SETTINGS:
        args = (logits, out, VOCAB, s["temperature"], s["top_k"], s["top_p"])
        row = dict(s)
        for name, kernel in (("search", search), ("bisection", bisection_threshold)):
            row[f"{name}_us"] = timed(lambda: kernel[(1,)](*args, BLOCK=BLOCK, num_warps=4), a.reps) - base
            row[f"{name}_key"] = int(out.item())
        if s["top_p"] == 1.0:
            kth = torch.topk(logits.float(), s["top_k"]).values[-1].view(torch.int32).item()
            row["exact_key"] = kth if kth >= 0 else kth ^ 0x7FFFFFFF
        row["same_threshold"] = row["search_key"] == row["bisection_key"] == row.get("exact_key", row["search_key"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "vocab": VOCAB, "block": BLOCK,
                       "empty_launch_us": base, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

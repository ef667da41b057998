"""Probe (one NVIDIA GPU): what the top-k / top-p thresholds cost a token, the serial tail of a filtered draw.

The monokernel's sampling task finds, in one program of 4 warps, the smallest logit that top-k and top-p keep
(kogc/codegen/templates/sampling.j2, `_filter_threshold`), then draws by Gumbel-max over what is kept. Here
that runs alone on one vector of laneformer-2b's vocabulary of logits, for a few settings and three cases: an
fp16 model's logits on one GPU and a rank's fp32 copy of them (both counted per 16-bit key in one pass), and
an fp32 model's (searched over 32-bit keys), beside the bisection of 32-bit keys it replaced (one threshold a
pass, a reduction across warps every block; kept in this file). `threshold` is the thresholds alone, `draw`
the whole filtered draw. Top-k's threshold is checked against torch's, and the counts against being left for
the next draw; the time is the median of R launches (CUDA events), less an empty launch's, each launched as the
monokernel is (4 warps, at most 168 registers).

    PYTHONPATH=. python experiments/sampling_tail.py --out $OUT/sampling-tail.json
"""
import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from kogc.codegen.loader import load_kernel
from kogc.codegen.sampler import sampler_source
from kogc.scheduler.tasks import HIST_WORDS

VOCAB = 128256          # laneformer-2b's
BLOCK = 2048            # the bisection's block (the argmax task's: kogc.scheduler.tile)
FILTER_BLOCK = 1024     # the filtered draw's (kogc/codegen/templates/sampling.j2)
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


PROBE = """

@triton.jit(do_not_specialize=["V", "temperature", "top_k", "top_p"])
def probe_threshold(LOGITS, OUT, HIST, V, temperature, top_k, top_p, KEY16: tl.constexpr, BLOCK: tl.constexpr):
    if KEY16:
        tl.store(OUT, _filter_threshold(LOGITS, V, HIST, temperature, top_k, top_p, tl.float16, BLOCK))
    else:
        tl.store(OUT, _filter_threshold(LOGITS, V, HIST, temperature, top_k, top_p, tl.float32, BLOCK))


@triton.jit(do_not_specialize=["V", "temperature", "top_k", "top_p", "step", "seed"])
def probe_draw(LOGITS, OUT, HIST, V, temperature, top_k, top_p, step, seed, KEY16: tl.constexpr,
               BLOCK: tl.constexpr):
    if KEY16:
        tok = _sample_filtered(LOGITS, V, HIST, step, seed, temperature, top_k, top_p, tl.float16, BLOCK)
    else:
        tok = _sample_filtered(LOGITS, V, HIST, step, seed, temperature, top_k, top_p, tl.float32, BLOCK)
    tl.store(OUT, tok.to(tl.int64))
"""

# (how the logits are stored, whether their values are fp16): one GPU's fp16 model, a rank's fp32 copy of an fp16
# model's logits (both counted per 16-bit key), an fp32 model's (searched over 32-bit keys)
CASES = [("fp16 model", torch.float16, 1), ("fp16 model, a rank's fp32 copy", torch.float32, 1),
         ("fp32 model", torch.float32, 0)]


def exact_key(logits, top_k, key16):
    """torch's k-th largest logit as the kernel's order key (16-bit or 32-bit)."""
    kth = torch.topk(logits.float(), top_k).values[-1]
    if key16:
        b = kth.half().view(torch.int16).item()
        return b if b >= 0 else b ^ 0x7FFF
    b = kth.view(torch.int32).item()
    return b if b >= 0 else b ^ 0x7FFFFFFF


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args()
    src = sampler_source() + PROBE
    threshold, _ = load_kernel(src, False, name="probe_threshold")
    draw, _ = load_kernel(src, False, name="probe_draw")
    g = torch.Generator().manual_seed(0)
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    hist = torch.zeros(HIST_WORDS, dtype=torch.int32, device="cuda")     # counts, range words, per-key words
    regs = dict(num_warps=4, maxnreg=168)          # the monokernel's launch (kogc.targets.nvidia_h200)
    base = timed(lambda: empty[(1,)](out), a.reps)
    rows = []
    values = torch.randn(VOCAB, generator=g) * 2.5
    for case, dtype, key16 in CASES:
        logits = (values.half() if key16 else values).to(dtype).cuda()
        for s in SETTINGS:
            args = (logits, out, hist, VOCAB, s["temperature"], s["top_k"], s["top_p"])
            row = dict(s, case=case)
            row["threshold_us"] = timed(lambda: threshold[(1,)](*args, KEY16=key16, BLOCK=FILTER_BLOCK, **regs),
                                        a.reps) - base
            row["threshold_key"] = int(out.item())
            row["draw_us"] = timed(lambda: draw[(1,)](*args, 0, 1, KEY16=key16, BLOCK=FILTER_BLOCK, **regs),
                                   a.reps) - base
            row["bisection_us"] = timed(lambda: bisection_threshold[(1,)](*args[:2], *args[3:], BLOCK=BLOCK),
                                        a.reps) - base
            if s["top_p"] == 1.0:
                row["exact"] = row["threshold_key"] == exact_key(logits, s["top_k"], key16)
            row["counts_cleared"] = not bool(hist.any())
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "vocab": VOCAB, "block": FILTER_BLOCK,
                       "empty_launch_us": base, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

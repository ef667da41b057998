"""Probe (one NVIDIA GPU): what the top-k / top-p thresholds cost a token, the serial tail of a filtered draw.

The monokernel's sampling task finds, in one program of 4 warps, the smallest logit that top-k and top-p keep
(kogc/codegen/templates/sampling.j2, `_filter_threshold`), then draws by Gumbel-max over what is kept. Here
that search runs alone on one vector of laneformer-2b's vocabulary of logits (fp16 as one GPU's kernel
stores them, fp32 as a rank's), with several bucket counts and blocks, beside the bisection it replaced
(one threshold a pass over 32-bit keys, a reduction across warps every block; kept in this file); `draw` is
the whole filtered draw. The thresholds of every form are checked equal to each other and to torch's
exact one (top-k); the time is the median of R launches (CUDA events), less an empty launch's, each
launched as the monokernel is (4 warps, at most 168 registers).

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
BLOCK = 2048            # the bisection's block (the argmax task's: kogc.scheduler.tile)
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
def probe_threshold(LOGITS, OUT, V, temperature, top_k, top_p, BLOCK: tl.constexpr, NB: tl.constexpr):
    tl.store(OUT, _filter_threshold(LOGITS, V, temperature, top_k, top_p, BLOCK, NB))


@triton.jit(do_not_specialize=["V", "temperature", "top_k", "top_p", "step", "seed"])
def probe_draw(LOGITS, OUT, V, temperature, top_k, top_p, step, seed, BLOCK: tl.constexpr):
    tl.store(OUT, _sample_filtered(LOGITS, V, step, seed, temperature, top_k, top_p, BLOCK).to(tl.int64))
"""


def exact_key(logits, top_k):
    """torch's k-th largest logit as the kernel's order key (16-bit for fp16 logits, 32-bit for fp32)."""
    kth = torch.topk(logits.float(), top_k).values[-1]
    if logits.dtype == torch.float16:
        b = kth.half().view(torch.int16).item()
        return b if b >= 0 else b ^ 0x7FFF
    b = kth.view(torch.int32).item()
    return b if b >= 0 else b ^ 0x7FFFFFFF


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args()
    src = _ENV.get_template("sampler.py.j2").render() + PROBE
    threshold, _ = load_kernel(src, False, name="probe_threshold")
    draw, _ = load_kernel(src, False, name="probe_draw")
    g = torch.Generator().manual_seed(0)
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    regs = dict(num_warps=4, maxnreg=168)          # the monokernel's launch (kogc.targets.nvidia_h200)
    base = timed(lambda: empty[(1,)](out), a.reps)
    rows = []
    for dtype in (torch.float16, torch.float32):
        logits = (torch.randn(VOCAB, generator=g) * 2.5).to(dtype).cuda()
        for s in SETTINGS:
            args = (logits, out, VOCAB, s["temperature"], s["top_k"], s["top_p"])
            row = dict(s, dtype=str(dtype).split(".")[-1])
            forms = [(f"buckets{nb}_block{blk}", threshold, dict(BLOCK=blk, NB=nb))
                     for nb, blk in ((128, 1024), (64, 1024), (32, 1024), (128, 2048), (64, 2048))
                     if dtype == torch.float16 or blk == 1024]
            forms += [("bisection", bisection_threshold, dict(BLOCK=BLOCK)),
                      ("draw_block1024", draw, dict(BLOCK=1024)), ("draw_block2048", draw, dict(BLOCK=2048))]
            draw_args = (0, 1)          # step, seed
            keys = set()
            for name, kernel, const in forms:
                extra = draw_args if kernel is draw else ()
                row[f"{name}_us"] = timed(lambda: kernel[(1,)](*args, *extra, **const, **regs), a.reps) - base
                if name.startswith("buckets"):
                    keys.add(int(out.item()))
                    row[f"{name}_key"] = int(out.item())
            if s["top_p"] == 1.0:
                keys.add(exact_key(logits, s["top_k"]))
            row["same_threshold"] = len(keys) == 1
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "vocab": VOCAB, "block": BLOCK,
                       "empty_launch_us": base, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

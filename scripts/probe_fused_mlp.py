"""Would the MLP as one phase pay? Time the fused task kind against today's W1/W3 and W2 tasks.

performance-notes.md (sixth session) designs the MLP as one phase: a task takes rows r of W1 and W3
and the matching columns of W2, and adds its fp32 share of W2's output into a per-(layer, lane) sum.
Its replay (`critical_path.py --fold-mlp`) says the step gains 12 / 10 / 7 / 1% if such a task costs
0.5 / 0.75 / 1 / 1.5 us more than a W1/W3 task does today. This probe measures that difference with
no dependencies at all: persistent programs stream the tasks of laneformer-2b's MLP (D 2048, F/L
1024, fp16; every lane and layer, distinct weights) back to back, in five modes:

- `w13`: today's W1/W3 tasks only (8 rows x 2048, rmsnorm prologue, 8 values stored);
- `w2`: today's W2 tasks only (16 rows x 1024, silu-mul prologue, 16 values stored);
- `separate`: both, as a step streams them;
- `fused`: 4 rows of W1 and of W3 plus the 4 matching W2 columns (48 KB), the 2048-value fp32 share
  added into the sum with atomics;
- `fused_store`: the same, the share stored to its own slot (the atomics' cost is the difference).

Per mode: ms, TB/s, and the mean time per task per program (ms x programs / tasks): in streaming
equilibrium, the fused task's time minus the W1/W3 task's is the replay's "extra".

    python3 scripts/probe_fused_mlp.py [--layers 28] [--lanes 8] [--reps 5]     # GPU; $OUT/probe_fused_mlp.json
    TRITON_INTERPRET=1 python3 scripts/probe_fused_mlp.py --layers 1 --lanes 1 --dim 64 --ffn 32 --programs 2 --reps 1
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from kogc.bench.measure import time_steps, write_result

MODES = ("w13", "w2", "separate", "fused", "fused_store", "fused_none")


@triton.jit
def _normed(H, G, D: tl.constexpr):
    """rmsnorm(h) * g rounded like the model (fp16 after each op)."""
    h = tl.load(H + tl.arange(0, D)).to(tl.float32)
    y = (h * tl.rsqrt(tl.sum(h * h, 0) / D + 1e-5)).to(tl.float16).to(tl.float32)
    return (y * tl.load(G + tl.arange(0, D)).to(tl.float32)).to(tl.float16).to(tl.float32)


@triton.jit
def mlp_tasks(W, H, G, Z, OUT, SUM, n13, n2, nf, P: tl.constexpr, D: tl.constexpr, F: tl.constexpr,
              R13: tl.constexpr, R2: tl.constexpr, RF: tl.constexpr, ATOMIC: tl.constexpr):
    """Tasks 0..n13-1 are W1/W3 tasks, then n2 W2 tasks, then nf fused ones, each its own weight tile
    (in that order in W); program pid takes tasks pid, pid + P, ..."""
    pid = tl.program_id(0)
    t = pid
    while t < n13 + n2 + nf:
        if t < n13:         # (names differ per branch: Triton wants one type per name across them)
            w13 = tl.load(W + t * (R13 * D) + tl.arange(0, R13 * D), eviction_policy="evict_first")
            acc13 = tl.sum(tl.reshape(w13, [R13, D]).to(tl.float32) * _normed(H, G, D)[None, :], 1)
            tl.store(OUT + t * R13 + tl.arange(0, R13), acc13.to(tl.float16))
        elif t < n13 + n2:
            base2 = n13 * (R13 * D) + (t - n13) * (R2 * F)
            w2 = tl.load(W + base2 + tl.arange(0, R2 * F), eviction_policy="evict_first")
            a2 = tl.load(Z + tl.arange(0, F)).to(tl.float32)
            b2 = tl.load(Z + F + tl.arange(0, F)).to(tl.float32)
            z2 = ((a2 / (1.0 + tl.exp(-a2))).to(tl.float16).to(tl.float32) * b2).to(tl.float16).to(tl.float32)
            acc2 = tl.sum(tl.reshape(w2, [R2, F]).to(tl.float32) * z2[None, :], 1)
            tl.store(OUT + n13 * R13 + (t - n13) * R2 + tl.arange(0, R2), acc2.to(tl.float16))
        else:
            k = t - n13 - n2
            basef = n13 * (R13 * D) + n2 * (R2 * F) + k * (3 * RF * D)
            r = tl.arange(0, RF * D)
            w1 = tl.reshape(tl.load(W + basef + r, eviction_policy="evict_first"), [RF, D]).to(tl.float32)
            w3 = tl.reshape(tl.load(W + basef + RF * D + r, eviction_policy="evict_first"), [RF, D]).to(tl.float32)
            w2t = tl.reshape(tl.load(W + basef + 2 * RF * D + r, eviction_policy="evict_first"), [RF, D])
            y = _normed(H, G, D)[None, :]
            af = tl.sum(w1 * y, 1).to(tl.float16).to(tl.float32)
            bf = tl.sum(w3 * y, 1).to(tl.float16).to(tl.float32)
            zf = ((af / (1.0 + tl.exp(-af))).to(tl.float16).to(tl.float32) * bf).to(tl.float16).to(tl.float32)
            share = tl.sum(w2t.to(tl.float32) * zf[:, None], 0)         # [D]: W2[:, rows] @ z[rows]
            group = k // (F // RF)                                       # its (layer, lane): one sum each
            if ATOMIC == 1:
                tl.atomic_add(SUM + group * D + tl.arange(0, D), share, sem="relaxed")
            elif ATOMIC == 2:                                            # no output: the body's own cost
                tl.store(SUM + k, tl.sum(share, 0))
            else:
                tl.store(SUM + k * D + tl.arange(0, D), share)
        t += P


def counts(mode: str, groups: int, F: int, R13=8, R2=16, RF=4, D=2048) -> tuple[int, int, int]:
    """(W1/W3 tasks, W2 tasks, fused tasks) of a mode over `groups` (layer, lane) pairs."""
    n13 = groups * 2 * F // R13 if mode in ("w13", "separate") else 0
    n2 = groups * D // R2 if mode in ("w2", "separate") else 0
    nf = groups * F // RF if mode.startswith("fused") else 0
    return n13, n2, nf


def run(mode: str, args, device: str) -> dict:
    D, F, groups = args.dim, args.ffn, args.layers * args.lanes
    R13, R2, RF = 8, 16, args.rf
    n13, n2, nf = counts(mode, groups, F, R13, R2, RF, D)
    numel = n13 * R13 * D + n2 * R2 * F + nf * 3 * RF * D
    gen = torch.Generator(device=device).manual_seed(0)       # on the device: GBs of weights
    W = torch.randn(numel, generator=gen, device=device, dtype=torch.float16) * D ** -0.5
    H = torch.randn(D, generator=gen, device=device).to(torch.float16)
    G = torch.ones(D, dtype=torch.float16, device=device)
    Z = torch.randn(2 * F, generator=gen, device=device).to(torch.float16)
    OUT = torch.zeros(max(n13 * R13 + n2 * R2, 1), dtype=torch.float16, device=device)
    SUM = torch.zeros(max(groups if mode == "fused" else nf, 1) * D, dtype=torch.float32, device=device)
    kw = dict(P=args.programs, D=D, F=F, R13=R13, R2=R2, RF=RF, ATOMIC={"fused": 1, "fused_none": 2}.get(mode, 0))
    launch = lambda i: mlp_tasks[(args.programs,)](W, H, G, Z, OUT, SUM, n13, n2, nf, **kw,  # noqa: E731
                                                   num_warps=args.warps)
    ms = time_steps(launch, 1, args.reps, device, warmup=1) if device == "cuda" else []
    SUM.zero_()         # the atomics added into it in every launch above: one more from zero, to check
    launch(0)
    med = sorted(ms)[len(ms) // 2] if ms else float("nan")
    tasks = n13 + n2 + nf
    row = {"mode": mode, "tasks": tasks, "bytes": 2 * numel, "ms": ms, "ms_median": med,
           "TBps": 2 * numel / (med * 1e-3) / 1e12 if ms else None,
           "us_per_task_per_program": med * 1e3 * args.programs / tasks if ms else None}
    row["check"] = check(mode, W, H, G, Z, OUT, SUM, n13, n2, nf, D, F, R13, R2, RF)
    return row


def check(mode, W, H, G, Z, OUT, SUM, n13, n2, nf, D, F, R13, R2, RF) -> float:
    """Max relative error of the first (layer, lane)'s results against torch (fp32 math)."""
    h = H.float()
    y = (h * torch.rsqrt((h * h).mean() + 1e-5)).half().float()
    y = (y * G.float()).half().float()
    if mode.startswith("fused"):
        k = F // RF                                       # the fused tasks of group 0
        w = W[: k * 3 * RF * D].view(k, 3, RF, D).float()
        a = torch.einsum("krd,d->kr", w[:, 0], y).half().float()
        b = torch.einsum("krd,d->kr", w[:, 1], y).half().float()
        z = (torch.nn.functional.silu(a).half().float() * b).half().float()
        if mode == "fused_none":                          # each task's share summed over D
            want, got = torch.einsum("krd,kr->k", w[:, 2], z), SUM[:k]
            return float((got - want).abs().max() / want.abs().max())
        want = torch.einsum("krd,kr->d", w[:, 2], z)
        got = SUM[:D] if mode == "fused" else SUM[: k * D].view(k, D).sum(0)
        return float((got - want).abs().max() / want.abs().max())
    if n13:
        w = W[: R13 * D * 4].view(4 * R13, D).float()
        want, got = w @ y, OUT[: 4 * R13].float()
        return float((got - want).abs().max() / want.abs().max())
    a, b = Z[:F].float(), Z[F:].float()
    z = (torch.nn.functional.silu(a).half().float() * b).half().float()
    w = W[: R2 * F * 2].view(2 * R2, F).float()
    want, got = w @ z, OUT[: 2 * R2].float()
    return float((got - want).abs().max() / want.abs().max())


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=1024, help="F / lanes: a lane's W1/W3 rows")
    ap.add_argument("--programs", type=int, default=396, help="132 SMs x 3, as the monokernel")
    ap.add_argument("--rf", type=int, default=4, help="a fused task's rows of W1 (and of W3, and columns of W2)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for mode in args.modes.split(","):
        row = run(mode, args, device)
        rows.append(row)
        t = row["us_per_task_per_program"]
        print(f"{mode:12s} {row['tasks']:7d} tasks, {row['bytes'] / 1e9:.3f} GB: {row['ms_median']:.3f} ms, "
              f"{row['TBps'] or float('nan'):.2f} TB/s, {t or float('nan'):.2f} us per task per program; "
              f"rel err {row['check']:.1e}", flush=True)
    write_result("probe_fused_mlp.json", rows)
    return rows


if __name__ == "__main__":
    main()

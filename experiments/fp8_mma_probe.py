"""Probe (one H200): an FP8 weight tile's products on tensor cores straight from registers.

kogc's FP8 matvec converts every weight to fp32 before its FFMA: per two weights one
F2FP.F16.E4M3.UNPACK_B, two HADD2.F32 and two FFMA, 2.5 instructions per weight byte against 1 for
fp16, and an FP8 task's body after its wait takes 2.71 us against 1.80 for fp16 (docs/fp8.md). An
mma through tl.dot was slower: both operands staged through shared memory.

Here the weights go to `mma.sync.m16n8k16` (f16 x f16, fp32 accumulation) from the registers their
load put them in, with no shared memory: the packed stream is permuted on the host so that each
thread's 128-bit load is exactly its A fragments (16 e4m3 = two k16 steps of rows g and g+8, g = lane
/ 4), unpacked by `cvt.rn.f16x2.e4m3x2` (exact: e4m3 is a subset of fp16). The k order inside each
32-column block is permuted the same way in the weights and in x, so a thread's B fragments (x as
fp16 pairs; every column of B the same x) are 16 contiguous bytes. Products of e4m3 and fp16 values
are exact in fp32; the sum is the tensor core's fp32 accumulation.

A tile is R = 16 rows of K = 2048 e4m3 (32 KB, kogc's FP8 tile at laneformer-2b's width) with a row
scale. Forms, each a persistent grid of P programs, tile i of program p = p + i * P:
- ffma:   kogc's way (the tile loaded flat, reshaped, .to(fp32), times x, summed per row, scaled);
- mma:    the permuted tile, one inline-asm mma pair per 16 bytes, per-row sums from the accumulators;
- fp16:   kogc's fp16 way on R = 8 rows (the same 32 KB), for reference.
Two sets of tiles: `hbm`, distinct tiles (1 GiB: HBM-bound), and `l2`, 8 MB read over and over (the
bodies' own cost shows). Each output is checked against torch (dequantized weights, fp32) by max
relative error; out is NaN-filled first.

    PYTHONPATH=. python experiments/fp8_mma_probe.py --out $OUT/fp8-mma.json
    python experiments/fp8_mma_probe.py --compile-only      # no GPU: compile for sm_90, registers, spills
"""
import argparse
import json
import os
import sys

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_stream_probe import ALIGNED, _usage, compile_sm90, median_launch_us  # noqa: E402

K = 2048
R8 = 16                   # FP8 rows per 32 KB tile
R16 = 8                   # fp16 rows per 32 KB tile
C = R8 * K // (32 * 16 * 4)   # 128-bit chunks per thread in a 4-warp program (16)
MMA_ASM = tl.constexpr("""{
.reg .b16 l<4>, h<4>;
.reg .b32 a<8>;
mov.b32 {l0, h0}, $4;
mov.b32 {l1, h1}, $5;
mov.b32 {l2, h2}, $6;
mov.b32 {l3, h3}, $7;
cvt.rn.f16x2.e4m3x2 a0, l0;
cvt.rn.f16x2.e4m3x2 a1, h0;
cvt.rn.f16x2.e4m3x2 a2, l1;
cvt.rn.f16x2.e4m3x2 a3, h1;
cvt.rn.f16x2.e4m3x2 a4, l2;
cvt.rn.f16x2.e4m3x2 a5, h2;
cvt.rn.f16x2.e4m3x2 a6, l3;
cvt.rn.f16x2.e4m3x2 a7, h3;
mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0, $1, $2, $3}, {a0, a1, a2, a3}, {$8, $9}, {$12, $13, $14, $15};
mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0, $1, $2, $3}, {a4, a5, a6, a7}, {$10, $11}, {$0, $1, $2, $3};
}""")


@triton.jit
def _ready_wait(FLAG):
    """kogc's task waits between its weight loads and its products: an acquire spin on a counter, here
    one already satisfied (the loads stay before it, as in the kernel; ptxas cannot sink them into it)."""
    while tl.atomic_add(FLAG, 0, sem="acquire", scope="gpu") < 0:
        pass


@triton.jit
def ffma(W, S, X, OUT, T, NT, FLAG, K: tl.constexpr, R: tl.constexpr, SCALED: tl.constexpr):
    """kogc's matvec: the tile loaded flat before the wait, reshaped, widened to fp32, times x, summed per
    row; SCALED (FP8): times each row's scale, loaded with the tile."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    rows = tl.arange(0, R)
    for i in range(T):
        t = (p + i * P) % NT
        w = tl.load(W + t.to(tl.int64) * (R * K) + tl.arange(0, R * K), eviction_policy="evict_first")
        if SCALED:
            s = tl.load(S + t * R + rows)
        else:
            s = 1.0
        _ready_wait(FLAG)
        x = tl.load(X + tl.arange(0, K)).to(tl.float32)
        acc = tl.sum(tl.reshape(w, [R, K]).to(tl.float32) * x[None, :], 1) * s
        tl.store(OUT + t * R + rows, acc)


@triton.jit
def mma_fp8(W, S, X, OUT, T, NT, FLAG, C: tl.constexpr):
    """W: int32 words of the permuted tiles, [NT, C, 128, 4] (kept 1-D: element i of C * 512 is thread
    (i // 4) % 128's register i % 4 of its chunk i // 512 in Triton's 1-D layout of four 32-bit words a
    thread); X: x as int32 fp16 pairs: thread th (q = th % 4, warp w) at chunk c reads words 16 n + 4 q +
    0..3 of block n = 4 c + w."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    i = tl.arange(0, C * 512)
    th = (i // 4) % 128
    xidx = 16 * (4 * (i // 512) + th // 32) + 4 * (th % 4) + i % 4
    zero = tl.zeros([C * 512], tl.float32)
    # after the chunks are summed, element e of 512 is thread e // 4's accumulator e % 4: row g = lane // 4
    # (accumulators 0, 1) or g + 8 (2, 3); columns 2q, 2q + 1 repeat the same sums, so lanes with q = 0 and
    # even accumulators give each row once per warp
    e = tl.arange(0, 512)
    lane = (e // 4) % 32
    row = lane // 4 + 8 * ((e % 4) // 2)
    take = ((lane % 4) == 0) & ((e % 2) == 0)
    rows = tl.arange(0, 16)
    sel = take[:, None] & (row[:, None] == rows[None, :])
    for it in range(T):
        t = (p + it * P) % NT
        w = tl.load(W + t.to(tl.int64) * (C * 512) + i, eviction_policy="evict_first")
        s = tl.load(S + t * 16 + rows)
        _ready_wait(FLAG)
        xw = tl.load(X + xidx)
        d = tl.inline_asm_elementwise(MMA_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r", [w, xw, zero],
                                      dtype=tl.float32, is_pure=True, pack=4)
        dsum = tl.sum(tl.reshape(d, [C, 512]), 0)
        acc = tl.sum(tl.where(sel, dsum[:, None], 0.0), 0) * s
        tl.store(OUT + t * 16 + rows, acc)


def permute_fp8(q):
    """q: [NT, 16, K] uint8 (e4m3 bytes) -> int32 words [NT, C, 128, 4] in fragment order. Thread th =
    32 w + lane (g = lane // 4, q = lane % 4) at chunk position c takes block n = 4 c + w (columns 32 n ..
    32 n + 31); its byte 8 s + 2 r + e (step s, A register r, element e) is row g + 8 (r % 2), column
    2 P + e of the pair P = 16 n + 4 q + 2 s + r // 2: the pair x's word j = 2 s + r // 2 holds."""
    import torch
    c = torch.arange(C, device=q.device)[:, None, None]
    th = torch.arange(128, device=q.device)[None, :, None]
    b = torch.arange(16, device=q.device)[None, None, :]
    s, r, e = b // 8, (b % 8) // 2, b % 2
    n = 4 * c + th // 32
    row = (th % 32) // 4 + 8 * (r % 2)
    col = 2 * (16 * n + 4 * (th % 4) + 2 * s + r // 2) + e
    row, col = torch.broadcast_tensors(row, col)
    out = q[:, row, col]                                   # [NT, C, 128, 16]
    return out.contiguous().view(torch.int32)              # [NT, C, 128, 4]


def compile_only():
    print(f"{'kernel':<12}{'regs':>6}{'spill B':>9}")
    for name, fn, sig, cx in kernels():
        k = compile_sm90(fn, sig, cx, dict(num_warps=4, num_stages=1), False, {(0,): ALIGNED, (2,): ALIGNED})
        regs, spill = _usage(k)
        print(f"{name:<12}{regs!s:>6}{spill!s:>9}")
        if name == "mma":
            sass_like = k.asm["ptx"]
            print(f"  ptx: {sass_like.count('mma.sync')} mma.sync, {sass_like.count('cvt.rn.f16x2.e4m3x2')} cvt, "
                  f"{sass_like.count('ld.global.v4')} ld.global.v4, {sass_like.count('bar.sync')} bar.sync")


def kernels():
    common = {"OUT": "*fp32", "T": "i32", "NT": "i32", "FLAG": "*i32"}
    cx = {"K": "constexpr", "R": "constexpr", "SCALED": "constexpr"}
    return [
        ("ffma", ffma, {"W": "*fp8e4nv", "S": "*fp32", "X": "*fp16", **common, **cx}, {"K": K, "R": R8, "SCALED": 1}),
        ("mma", mma_fp8, {"W": "*i32", "S": "*fp32", "X": "*i32", **common, "C": "constexpr"}, {"C": C}),
        ("fp16", ffma, {"W": "*fp16", "S": "*fp32", "X": "*fp16", **common, **cx}, {"K": K, "R": R16, "SCALED": 0}),
    ]


def run(args):
    import torch
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    torch.manual_seed(0)
    nt = args.gib * (1 << 30) // (32 * 1024)
    wf = torch.randn(nt, R8, K, device=dev) * 0.05
    sc = wf.abs().amax(2) / 448.0
    q8 = (wf / sc[:, :, None]).to(torch.float8_e4m3fn)
    deq = q8.float() * sc[:, :, None]
    del wf
    x = torch.randn(K, device=dev, dtype=torch.float16)
    ref8 = torch.cat([blk @ x.float() for blk in deq.split(4096)]).reshape(-1)
    del deq
    w16 = torch.randn(nt, R16, K, device=dev, dtype=torch.float16)
    ref16 = torch.cat([blk.float() @ x.float() for blk in w16.split(4096)]).reshape(-1)
    # the permuted stream and x: block n's k order is pair 16 n + 4 q + j for thread q's word j: x's words
    # are in natural order already (word P = columns 2P, 2P + 1)
    perm = torch.cat([permute_fp8(b.view(torch.uint8)) for b in q8.split(2048)])
    xw = x.view(torch.int32)
    out = torch.empty(nt * R8, device=dev, dtype=torch.float32)
    flag = torch.zeros(1, device=dev, dtype=torch.int32)
    warm_up(args.warm_s)
    rows = []
    for tiles_name, NT in (("hbm", nt), ("l2", args.l2_tiles)):
        for name, fn, _, cx in kernels():
            for P in args.programs:
                T = max(1, (nt if tiles_name == "hbm" else args.reads) // P)
                if name == "ffma":
                    a = (q8, sc, x)
                elif name == "mma":
                    a = (perm, sc, xw)
                else:
                    a = (w16, sc, x)
                ref = ref16 if name == "fp16" else ref8
                rpt = R16 if name == "fp16" else R8
                run1 = lambda: fn[(P,)](*a, out, T, NT, flag, num_warps=4, num_stages=1, **cx)
                rows.append(time_tiles(run1, out, ref, min(NT, P * T) * rpt, args, tiles=tiles_name, form=name,
                                       P=P, tiles_per_program=T))
    report(f"{props.name}: 32 KB tiles (FP8 16 x {K}, fp16 8 x {K}); hbm: {nt} distinct tiles; l2: {args.l2_tiles} "
           "tiles reread", props.name, rows, args.out)


def warm_up(seconds: float):
    """Busy the GPU for `seconds` (matrix products), so that the first form is not timed at idle clocks."""
    import time
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def time_tiles(run1, out, ref, n_out, args, **row):
    """One form's launch: its first n_out outputs (out NaN-filled first) against ref by max relative
    error, then its median time; the row (with the caller's fields and tiles_per_program), also printed."""
    import torch
    out.fill_(float("nan"))
    run1()
    torch.cuda.synchronize()
    got, want = out[:n_out], ref[:n_out]
    err = ((got - want).abs().max() / want.abs().max()).item()
    us = median_launch_us(run1, args.warmup, args.iters)
    T, P = row["tiles_per_program"], row["P"]
    row.update(us=us, us_per_tile=us / T, GBps=P * T * 32768 / (us * 1e-6) / 1e9, rel_err=err)
    print(json.dumps(row), flush=True)
    return row


def tile_probe_args(doc: str, reads_help: str = "tiles read per launch from the l2 set") -> argparse.ArgumentParser:
    """The options every tile probe takes: where the JSON goes, the sizes, the programs, the timing."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--gib", type=int, default=1)
    ap.add_argument("--l2-tiles", type=int, default=256, help="tiles of the L2-resident set (8 MB)")
    ap.add_argument("--reads", type=int, default=32768, help=reads_help)
    ap.add_argument("--programs", type=int, nargs="+", default=[132, 396])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warm-s", type=float, default=2.0, help="seconds of matrix products before timing")
    return ap


def report(title, device, rows, out):
    """The rows as a table under title, and as JSON in `out` if given."""
    print(title)
    print(f"{'tiles':<6}{'form':<6}{'P':>5}{'us/tile':>9}{'GB/s':>8}{'rel err':>10}")
    for r in rows:
        print(f"{r['tiles']:<6}{r['form']:<6}{r['P']:>5}{r['us_per_tile']:>9.3f}{r['GBps']:>8.0f}{r['rel_err']:>10.2e}")
    if out:
        json.dump(dict(device=device, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    a = tile_probe_args(__doc__).parse_args()
    compile_only() if a.compile_only else run(a)

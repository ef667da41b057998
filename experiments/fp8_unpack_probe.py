"""Probe (one H200): FP8 weights widened by integer ops instead of the conversion unit.

kogc's FP8 matvec widens two e4m3 weights with one `F2FP.F16.E4M3.UNPACK_B`, then each to fp32 with
`HADD2.F32` before its `FFMA` (docs/fp8.md). FP8 products take 2.3-2.8x fp16's for 2x the weights
(a detail profile), and an mma fed from registers, which halved the instructions but kept the F2FP,
was no faster with three programs an SM. If the F2FP's rate (a conversion, far below the FMA pipe's on
Hopper) is what paces them, widening by bit operations on the integer pipe should help: per 32-bit
word of four weights

    a = (q & 0x80008000) | ((q & 0x7F007F00) >> 1)     # bytes 1 and 3 as fp16 bits, value x 2^-8
    b = (q' & 0x80008000) | ((q' & 0x7F007F00) >> 1)   # q' = q << 8: bytes 0 and 2

(e4m3's sign, exponent and mantissa moved to fp16's places: exact, subnormals included, the 2^8 folded
into the row's scale), then each half to fp32 as before. The bytes stay in column order; x is taken
apart into its four columns per word instead (small), and the products are formed in the words' layout.

A tile is R = 16 rows of K = 2048 e4m3 (32 KB, kogc's FP8 tile at laneformer-2b's width) with a row
scale, loaded before a ready wait as a kernel task's is. Forms (a persistent grid of P programs, tile i
of program p = (p + i * P) % NT):
- cvt:  kogc's way (the tile loaded flat, reshaped, .to(fp32), times x, summed per row, scaled);
- int:  the tile loaded as 32-bit words and widened by the bit operations above;
- asm:  int with the widening written in inline PTX (GPU only: the interpreter has no inline assembly);
- mixed: a word of each pair each way (the conversion unit and the integer pipe sharing the widening;
         GPU only);
- fp16: kogc's fp16 way on R = 8 rows (the same 32 KB), for reference.
Sets of tiles: `hbm` (1 GiB of distinct tiles), `l2` (8 MB reread), `l1` (each program rereads its own
tile from L1: the products' own cost). Each output is checked against torch (dequantized weights,
fp32) by max relative error; out is NaN-filled first.

    PYTHONPATH=. python experiments/fp8_unpack_probe.py --out $OUT/fp8-unpack.json
    python experiments/fp8_unpack_probe.py --compile-only   # no GPU: sm_90 registers, spills, SASS mix
    python experiments/fp8_unpack_probe.py --interpret      # no GPU: the int form against torch
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

if "--interpret" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"      # before triton is imported: @triton.jit reads it

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

K = 2048
R8 = 16                   # FP8 rows per 32 KB tile
R16 = 8                   # fp16 rows per 32 KB tile


@triton.jit
def _ready_wait(FLAG):
    """kogc's task waits between its weight loads and its products: an acquire spin on a counter, here
    one already satisfied (the loads stay before it, as in the kernel)."""
    while tl.atomic_add(FLAG, 0, sem="acquire", scope="gpu") < 0:
        pass


@triton.jit
def _half(v):
    """The low 16 bits of each word as fp16 bits, widened to fp32."""
    return v.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _word_products(q, x, R: tl.constexpr, K: tl.constexpr):
    """The rows' sums of R x K e4m3 as R * K / 4 int32 words (bytes in column order), times x, times 2^-8:
    each word widened by the bit operations above, the products formed in the words' own layout against
    x taken apart into its four columns per word (as the kernel's candidate form does)."""
    SIGNS: tl.constexpr = -2147450880       # 0x80008000 as an int32 (a Triton literal must fit one)
    q = tl.reshape(q, [R, K // 4])
    a = (q & SIGNS) | ((q & 0x7F007F00) >> 1)        # bytes 1 and 3: columns 4j + 1 and 4j + 3
    q2 = q << 8
    b = (q2 & SIGNS) | ((q2 & 0x7F007F00) >> 1)      # bytes 0 and 2: columns 4j and 4j + 2
    xe, xo = tl.split(tl.reshape(x, [K // 4, 2, 2]))      # x[4j + 2p] and x[4j + 2p + 1] at [j, p]
    x0, x2 = tl.split(xe)
    x1, x3 = tl.split(xo)
    prod = (_half(b) * x0[None, :] + _half(a) * x1[None, :] + _half(b >> 16) * x2[None, :]
            + _half(a >> 16) * x3[None, :])
    return tl.sum(prod, 1)


WIDEN_ASM = tl.constexpr("""{
.reg .b32 a, b, t, s;
.reg .b16 al, ah, bl, bh;
and.b32 s, $4, 0x80008000;
and.b32 t, $4, 0x7F007F00;
shr.b32 t, t, 1;
or.b32 a, s, t;
shl.b32 s, $4, 8;
and.b32 t, s, 0x7F007F00;
and.b32 s, s, 0x80008000;
shr.b32 t, t, 1;
or.b32 b, s, t;
mov.b32 {al, ah}, a;
mov.b32 {bl, bh}, b;
cvt.f32.f16 $0, bl;
cvt.f32.f16 $1, al;
cvt.f32.f16 $2, bh;
cvt.f32.f16 $3, ah;
}""")


@triton.jit
def _word_products_asm(q, x, R: tl.constexpr, K: tl.constexpr):
    """_word_products with each word widened by inline PTX (the same bit operations; each fp16 half
    widened from its own 16-bit register, which ptxas can read in place): GPU only."""
    q = tl.reshape(q, [R, K // 4])
    v0, v1, v2, v3 = tl.inline_asm_elementwise(WIDEN_ASM, "=r,=r,=r,=r,r", [q], dtype=(tl.float32,) * 4,
                                               is_pure=True, pack=1)
    xe, xo = tl.split(tl.reshape(x, [K // 4, 2, 2]))
    x0, x2 = tl.split(xe)
    x1, x3 = tl.split(xo)
    return tl.sum(v0 * x0[None, :] + v1 * x1[None, :] + v2 * x2[None, :] + v3 * x3[None, :], 1)


@triton.jit
def asm_form(W, S, X, OUT, T, NT, FLAG, K: tl.constexpr, R: tl.constexpr, L1: tl.constexpr):
    """int_form with the widening in inline PTX (GPU only)."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    rows = tl.arange(0, R)
    N: tl.constexpr = R * K // 4
    i = 0
    while i < T:
        t = (p + i * P) % NT
        i += 1
        if L1:
            q = tl.load(W + t.to(tl.int64) * N + tl.arange(0, N))
        else:
            q = tl.load(W + t.to(tl.int64) * N + tl.arange(0, N), eviction_policy="evict_first")
        s = tl.load(S + t * R + rows)
        _ready_wait(FLAG)
        x = tl.load(X + tl.arange(0, K)).to(tl.float32)
        acc = _word_products_asm(q, x, R, K) * (s * 256.0)
        tl.store(OUT + t * R + rows, acc)


@triton.jit
def cvt_form(W, S, X, OUT, T, NT, FLAG, K: tl.constexpr, R: tl.constexpr, SCALED: tl.constexpr,
             L1: tl.constexpr):
    """kogc's matvec: the tile loaded flat before the wait, reshaped, widened to fp32, times x, summed per
    row; SCALED (FP8): times each row's scale, loaded with the tile."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    rows = tl.arange(0, R)
    for i in tl.range(0, T):
        t = (p + i * P) % NT
        if L1:
            w = tl.load(W + t.to(tl.int64) * (R * K) + tl.arange(0, R * K))
        else:
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
def int_form(W, S, X, OUT, T, NT, FLAG, K: tl.constexpr, R: tl.constexpr, L1: tl.constexpr):
    """The same task with the tile as 32-bit words, widened by bit operations; the rows' sums times
    scale x 2^8."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    rows = tl.arange(0, R)
    N: tl.constexpr = R * K // 4
    i = 0
    while i < T:        # (a while loop: the interpreter's range() refuses a scalar argument)
        t = (p + i * P) % NT
        i += 1
        if L1:
            q = tl.load(W + t.to(tl.int64) * N + tl.arange(0, N))
        else:
            q = tl.load(W + t.to(tl.int64) * N + tl.arange(0, N), eviction_policy="evict_first")
        s = tl.load(S + t * R + rows)
        _ready_wait(FLAG)
        x = tl.load(X + tl.arange(0, K)).to(tl.float32)
        acc = _word_products(q, x, R, K) * (s * 256.0)
        tl.store(OUT + t * R + rows, acc)


PAIR_ASM = tl.constexpr("""{
.reg .b32 a, b, t, s, h0, h1;
.reg .b16 al, ah, bl, bh, lo, hi, cl, ch, dl, dh;
mov.b32 {lo, hi}, $8;
cvt.rn.f16x2.e4m3x2 h0, lo;
cvt.rn.f16x2.e4m3x2 h1, hi;
mov.b32 {cl, ch}, h0;
mov.b32 {dl, dh}, h1;
cvt.f32.f16 $0, cl;
cvt.f32.f16 $1, ch;
cvt.f32.f16 $2, dl;
cvt.f32.f16 $3, dh;
and.b32 s, $9, 0x80008000;
and.b32 t, $9, 0x7F007F00;
shr.b32 t, t, 1;
or.b32 a, s, t;
shl.b32 s, $9, 8;
and.b32 t, s, 0x7F007F00;
and.b32 s, s, 0x80008000;
shr.b32 t, t, 1;
or.b32 b, s, t;
mov.b32 {al, ah}, a;
mov.b32 {bl, bh}, b;
cvt.f32.f16 $4, bl;
cvt.f32.f16 $5, al;
cvt.f32.f16 $6, bh;
cvt.f32.f16 $7, ah;
}""")


@triton.jit
def mixed_form(W, S, X, OUT, T, NT, FLAG, K: tl.constexpr, R: tl.constexpr, L1: tl.constexpr):
    """A word of each pair each way, so that the conversion unit and the integer pipe share the widening
    (the kernel candidate's form 2, GPU only): the first word by cvt.rn.f16x2.e4m3x2 (exact), the second
    by the bit operations (x 2^-8, undone in x's columns)."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    rows = tl.arange(0, R)
    N: tl.constexpr = R * K // 4
    i = 0
    while i < T:
        t = (p + i * P) % NT
        i += 1
        if L1:
            q = tl.load(W + t.to(tl.int64) * N + tl.arange(0, N))
        else:
            q = tl.load(W + t.to(tl.int64) * N + tl.arange(0, N), eviction_policy="evict_first")
        s = tl.load(S + t * R + rows)
        _ready_wait(FLAG)
        x = tl.load(X + tl.arange(0, K)).to(tl.float32)
        qa, qb = tl.split(tl.reshape(q, [R, K // 8, 2]))
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            PAIR_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [qa, qb], dtype=(tl.float32,) * 8, is_pure=True, pack=1)
        e, o = tl.split(tl.reshape(x, [K // 8, 2, 2, 2]))     # x[8j + 4p + 2q] and + 1 at [j, p, q]
        e0, e1 = tl.split(e)
        o0, o1 = tl.split(o)
        x0, x4 = tl.split(e0)
        x2, x6 = tl.split(e1)
        x1, x5 = tl.split(o0)
        x3, x7 = tl.split(o1)
        prod = (v0 * x0[None, :] + v1 * x1[None, :] + v2 * x2[None, :] + v3 * x3[None, :]
                + v4 * (x4 * 256.0)[None, :] + v5 * (x5 * 256.0)[None, :] + v6 * (x6 * 256.0)[None, :]
                + v7 * (x7 * 256.0)[None, :])
        tl.store(OUT + t * R + rows, tl.sum(prod, 1) * s)


def quantized(nt, device):
    import torch
    wf = torch.randn(nt, R8, K, device=device) * 0.05
    wf[0, 0, :64] = torch.linspace(-1e-4, 1e-4, 64)       # subnormals and zeros in the first row
    sc = wf.abs().amax(2) / 448.0
    q8 = (wf / sc[:, :, None]).to(torch.float8_e4m3fn)
    return q8, sc


def interpret_check():
    """The int form under Triton's interpreter against torch (a few tiles, every byte value once)."""
    import torch
    torch.manual_seed(0)
    nt = 3
    q8, sc = quantized(nt, "cpu")
    allb = torch.arange(256, dtype=torch.uint8)
    allb = allb[(allb & 0x7F) != 0x7F]                       # e4m3fn's NaNs never stored
    q8.view(torch.uint8)[1, 0, :allb.numel()] = allb
    x = torch.randn(K, dtype=torch.float16)
    ref = (q8.float() * sc[:, :, None]) @ x.float()
    out = torch.full((nt * R8,), float("nan"))
    w = q8.view(torch.uint8).view(torch.int32)
    flag = torch.zeros(1, dtype=torch.int32)
    int_form[(nt,)](w.view(-1), sc.reshape(-1), x, out, 1, nt, flag, K=K, R=R8, L1=0)
    err = ((out - ref.reshape(-1)).abs().max() / ref.abs().max()).item()
    print(f"int form under the interpreter: max relative error {err:.2e} against torch ({nt} tiles)")
    assert err < 1e-5, err


def kernels():
    common = {"OUT": "*fp32", "T": "i32", "NT": "i32", "FLAG": "*i32"}
    return [
        ("cvt", cvt_form, {"W": "*fp8e4nv", "S": "*fp32", "X": "*fp16", **common, "K": "constexpr", "R": "constexpr",
                           "SCALED": "constexpr", "L1": "constexpr"}, {"K": K, "R": R8, "SCALED": 1}),
        ("int", int_form, {"W": "*i32", "S": "*fp32", "X": "*fp16", **common, "K": "constexpr", "R": "constexpr",
                           "L1": "constexpr"}, {"K": K, "R": R8}),
        ("asm", asm_form, {"W": "*i32", "S": "*fp32", "X": "*fp16", **common, "K": "constexpr", "R": "constexpr",
                           "L1": "constexpr"}, {"K": K, "R": R8}),
        ("mixed", mixed_form, {"W": "*i32", "S": "*fp32", "X": "*fp16", **common, "K": "constexpr", "R": "constexpr",
                               "L1": "constexpr"}, {"K": K, "R": R8}),
        ("fp16", cvt_form, {"W": "*fp16", "S": "*fp32", "X": "*fp16", **common, "K": "constexpr", "R": "constexpr",
                            "SCALED": "constexpr", "L1": "constexpr"}, {"K": K, "R": R16, "SCALED": 0}),
    ]


def compile_only():
    from gluon_stream_probe import ALIGNED, _usage, compile_sm90
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    ops = ["F2FP", "HADD2.F32", "LOP3", "SHF", "PRMT", "IMAD", "FFMA", "FADD", "BAR", "STS", "LDS", "SHFL"]
    print(f"{'kernel':<6}{'regs':>6}{'spill B':>9}  SASS per tile: " + " ".join(ops))
    for name, fn, sig, cx in kernels():
        aligned = {(j,): ALIGNED for j, ty in enumerate(sig.values()) if ty.startswith("*")}
        k = compile_sm90(fn, sig, {**cx, "L1": 0}, dict(num_warps=4, num_stages=1), False, aligned)
        regs, spill = _usage(k)
        with tempfile.TemporaryDirectory() as tmp:
            open(f"{tmp}/k.cubin", "wb").write(k.asm["cubin"])
            sass = subprocess.run([cuobjdump, "-sass", f"{tmp}/k.cubin"], capture_output=True, text=True).stdout
        ins = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass)
        counts = [sum(1 for i in ins if i == op or i.startswith(op + ".")) for op in ops]
        print(f"{name:<6}{regs!s:>6}{spill!s:>9}  " + " ".join(f"{c}" for c in counts) + f"  ({len(ins)} in all)")


def run(args):
    import torch
    from gluon_stream_probe import median_launch_us
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    torch.manual_seed(0)
    nt = args.gib * (1 << 30) // (32 * 1024)
    q8, sc = quantized(nt, dev)
    deq = q8.float() * sc[:, :, None]
    x = torch.randn(K, device=dev, dtype=torch.float16)
    ref8 = torch.cat([blk @ x.float() for blk in deq.split(4096)]).reshape(-1)
    del deq
    w16 = torch.randn(nt, R16, K, device=dev, dtype=torch.float16)
    ref16 = torch.cat([blk.float() @ x.float() for blk in w16.split(4096)]).reshape(-1)
    words = q8.view(torch.uint8).reshape(-1).view(torch.int32)
    out = torch.empty(nt * R8, device=dev, dtype=torch.float32)
    flag = torch.zeros(1, device=dev, dtype=torch.int32)
    rows = []
    for tiles_name in ("hbm", "l2", "l1"):
        for name, fn, _, cx in kernels():
            for P in args.programs:
                NT = {"hbm": nt, "l2": args.l2_tiles, "l1": P}[tiles_name]
                T = max(1, (nt if tiles_name == "hbm" else args.reads) // P)
                a = {"cvt": (q8, sc, x), "int": (words, sc, x), "asm": (words, sc, x), "fp16": (w16, sc, x),
                     "mixed": (words, sc, x)}[name]
                ref = ref16 if name == "fp16" else ref8
                rpt = R16 if name == "fp16" else R8
                L1 = int(tiles_name == "l1")
                run1 = lambda: fn[(P,)](*a, out, T, NT, flag, num_warps=4, num_stages=1, L1=L1, **cx)
                out.fill_(float("nan"))
                run1()
                torch.cuda.synchronize()
                n_out = min(NT, P * T) * rpt
                got, want = out[:n_out], ref[:n_out]
                err = ((got - want).abs().max() / want.abs().max()).item()
                us = median_launch_us(run1, args.warmup, args.iters)
                row = dict(tiles=tiles_name, form=name, P=P, tiles_per_program=T, us=us, us_per_tile=us / T,
                           GBps=P * T * 32768 / (us * 1e-6) / 1e9, rel_err=err)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"{props.name}: 32 KB tiles (FP8 16 x {K}, fp16 8 x {K}); hbm: {nt} distinct tiles; l2: {args.l2_tiles} "
          f"tiles reread; l1: each program its own tile")
    print(f"{'tiles':<6}{'form':<6}{'P':>5}{'us/tile':>9}{'GB/s':>8}{'rel err':>10}")
    for r in rows:
        print(f"{r['tiles']:<6}{r['form']:<6}{r['P']:>5}{r['us_per_tile']:>9.3f}{r['GBps']:>8.0f}{r['rel_err']:>10.2e}")
    if args.out:
        json.dump(dict(device=props.name, rows=rows), open(args.out, "w"), indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--gib", type=int, default=1)
    ap.add_argument("--l2-tiles", type=int, default=256, help="tiles of the L2-resident set (8 MB)")
    ap.add_argument("--reads", type=int, default=32768, help="tiles read per launch from the l2 and l1 sets")
    ap.add_argument("--programs", type=int, nargs="+", default=[132, 396])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=7)
    a = ap.parse_args()
    if a.compile_only:
        compile_only()
    elif a.interpret:
        interpret_check()
    else:
        run(a)

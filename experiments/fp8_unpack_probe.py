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
import os
import sys

if "--interpret" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"      # before triton is imported: @triton.jit reads it

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_mma_probe import _ready_wait, report, tile_probe_args, time_tiles, warm_up  # noqa: E402

K = 2048
R8 = 16                   # FP8 rows per 32 KB tile
R16 = 8                   # fp16 rows per 32 KB tile


@triton.jit
def _half(v):
    """The low 16 bits of each word as fp16 bits, widened to fp32."""
    return v.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _widen_bits(q):
    """Words of four e4m3 -> their values x 2^-8 in fp32, in column order, by the bit operations above
    (0x80008000 written as an int32: a Triton literal must fit one)."""
    SIGNS: tl.constexpr = -2147450880
    a = (q & SIGNS) | ((q & 0x7F007F00) >> 1)        # bytes 1 and 3
    q2 = q << 8
    b = (q2 & SIGNS) | ((q2 & 0x7F007F00) >> 1)      # bytes 0 and 2
    return _half(b), _half(a), _half(b >> 16), _half(a >> 16)


# The same bit operations in PTX, each fp16 half widened from its own 16-bit register: one word (BITS),
# or two words, the first by the conversion unit (exact) and the second by the bit operations (PAIR).
BITS = """and.b32 s, $W, 0x80008000;
and.b32 t, $W, 0x7F007F00;
shr.b32 t, t, 1;
or.b32 a, s, t;
shl.b32 s, $W, 8;
and.b32 t, s, 0x7F007F00;
and.b32 s, s, 0x80008000;
shr.b32 t, t, 1;
or.b32 b, s, t;
mov.b32 {al, ah}, a;
mov.b32 {bl, bh}, b;
cvt.f32.f16 $O0, bl;
cvt.f32.f16 $O1, al;
cvt.f32.f16 $O2, bh;
cvt.f32.f16 $O3, ah;
"""
REGS = ".reg .b32 a, b, t, s, h0, h1;\n.reg .b16 al, ah, bl, bh, lo, hi, cl, ch, dl, dh;\n"
BITS_ASM = tl.constexpr("{\n" + REGS + BITS.replace("$W", "$4").replace("$O", "$") + "}")
PAIR_ASM = tl.constexpr("{\n" + REGS + """mov.b32 {lo, hi}, $8;
cvt.rn.f16x2.e4m3x2 h0, lo;
cvt.rn.f16x2.e4m3x2 h1, hi;
mov.b32 {cl, ch}, h0;
mov.b32 {dl, dh}, h1;
cvt.f32.f16 $0, cl;
cvt.f32.f16 $1, ch;
cvt.f32.f16 $2, dl;
cvt.f32.f16 $3, dh;
""" + BITS.replace("$W", "$9").replace("$O0", "$4").replace("$O1", "$5").replace("$O2", "$6").replace("$O3", "$7")
    + "}")


@triton.jit
def _columns(x, K: tl.constexpr, G: tl.constexpr):
    """x taken apart into its G (4 or 8) columns per group of G: x[G j + c] at [j] of the c-th."""
    if G == 4:
        e, o = tl.split(tl.reshape(x, [K // 4, 2, 2]))      # x[4j + 2p] and x[4j + 2p + 1] at [j, p]
        x0, x2 = tl.split(e)
        x1, x3 = tl.split(o)
        return x0, x1, x2, x3
    else:
        e, o = tl.split(tl.reshape(x, [K // 8, 2, 2, 2]))   # x[8j + 4p + 2q] and + 1 at [j, p, q]
        e0, e1 = tl.split(e)
        o0, o1 = tl.split(o)
        x0, x4 = tl.split(e0)
        x2, x6 = tl.split(e1)
        x1, x5 = tl.split(o0)
        x3, x7 = tl.split(o1)
        return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _products(w, x, R: tl.constexpr, K: tl.constexpr, FORM: tl.constexpr):
    """The rows' sums of one tile times x (unscaled). FORM 0: the tile as e4m3 (or fp16) values, widened by
    .to(fp32) (kogc's way); 1 / 2: as int32 words, widened by the bit operations in Triton / in PTX, the
    products formed in the words' own layout against x taken apart (as the kernel candidate's form 1);
    3: each pair of words one each way in PTX (the candidate's form 2), the 2^-8 undone in x."""
    if FORM == 0:
        return tl.sum(tl.reshape(w, [R, K]).to(tl.float32) * x[None, :], 1)
    elif FORM == 3:
        qa, qb = tl.split(tl.reshape(w, [R, K // 8, 2]))
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            PAIR_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [qa, qb], dtype=(tl.float32,) * 8, is_pure=True, pack=1)
        x0, x1, x2, x3, x4, x5, x6, x7 = _columns(x, K, 8)
        prod = (v0 * x0[None, :] + v1 * x1[None, :] + v2 * x2[None, :] + v3 * x3[None, :]
                + v4 * (x4 * 256.0)[None, :] + v5 * (x5 * 256.0)[None, :] + v6 * (x6 * 256.0)[None, :]
                + v7 * (x7 * 256.0)[None, :])
        return tl.sum(prod, 1)
    else:
        q = tl.reshape(w, [R, K // 4])
        if FORM == 1:
            v0, v1, v2, v3 = _widen_bits(q)
        else:
            v0, v1, v2, v3 = tl.inline_asm_elementwise(BITS_ASM, "=r,=r,=r,=r,r", [q], dtype=(tl.float32,) * 4,
                                                       is_pure=True, pack=1)
        x0, x1, x2, x3 = _columns(x, K, 4)
        return tl.sum(v0 * x0[None, :] + v1 * x1[None, :] + v2 * x2[None, :] + v3 * x3[None, :], 1) * 256.0


@triton.jit
def task_form(W, S, X, OUT, T, NT, FLAG, K: tl.constexpr, R: tl.constexpr, N: tl.constexpr, FORM: tl.constexpr,
              SCALED: tl.constexpr, L1: tl.constexpr):
    """Tile i of program p is (p + i * P) % NT: its N stream elements (bytes, halves or words) loaded before
    a ready wait, as a kernel task's are, then _products in FORM; SCALED: times each row's scale, loaded
    with the tile. L1: plain loads (the set is each program's own tile, reread from L1)."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    rows = tl.arange(0, R)
    i = 0
    while i < T:        # (a while loop: the interpreter's range() refuses a scalar argument)
        t = (p + i * P) % NT
        i += 1
        if L1:
            w = tl.load(W + t.to(tl.int64) * N + tl.arange(0, N))
        else:
            w = tl.load(W + t.to(tl.int64) * N + tl.arange(0, N), eviction_policy="evict_first")
        if SCALED:
            s = tl.load(S + t * R + rows)
        else:
            s = 1.0
        _ready_wait(FLAG)
        x = tl.load(X + tl.arange(0, K)).to(tl.float32)
        tl.store(OUT + t * R + rows, _products(w, x, R, K, FORM) * s)


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
    task_form[(nt,)](w.view(-1), sc.reshape(-1), x, out, 1, nt, flag, K=K, R=R8, N=R8 * K // 4, FORM=1, SCALED=1,
                     L1=0)
    err = ((out - ref.reshape(-1)).abs().max() / ref.abs().max()).item()
    print(f"int form under the interpreter: max relative error {err:.2e} against torch ({nt} tiles)")
    assert err < 1e-5, err


FORMS = {"cvt": ("*fp8e4nv", R8, R8 * K, 0), "int": ("*i32", R8, R8 * K // 4, 1), "asm": ("*i32", R8, R8 * K // 4, 2),
         "mixed": ("*i32", R8, R8 * K // 4, 3), "fp16": ("*fp16", R16, R16 * K, 0)}   # W's type, rows, N, FORM


def constexprs(name):
    _, r, n, form = FORMS[name]
    return {"K": K, "R": r, "N": n, "FORM": form, "SCALED": int(name != "fp16")}


def compile_only():
    from gluon_stream_probe import print_sass_mix
    ops = ["F2FP", "HADD2.F32", "LOP3", "SHF", "PRMT", "IMAD", "FFMA", "FADD", "BAR", "STS", "LDS", "SHFL"]
    rows = []
    for name, (wty, *_) in FORMS.items():
        sig = {"W": wty, "S": "*fp32", "X": "*fp16", "OUT": "*fp32", "T": "i32", "NT": "i32", "FLAG": "*i32",
               **{c: "constexpr" for c in ("K", "R", "N", "FORM", "SCALED", "L1")}}
        rows.append((name, task_form, sig, {**constexprs(name), "L1": 0}))
    print_sass_mix(rows, ops)


def run(args):
    import torch
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
    warm_up(args.warm_s)
    rows = []
    for tiles_name in ("hbm", "l2", "l1"):
        for name in FORMS:
            for P in args.programs:
                NT = {"hbm": nt, "l2": args.l2_tiles, "l1": P}[tiles_name]
                T = max(1, (nt if tiles_name == "hbm" else args.reads) // P)
                a = {"cvt": q8, "fp16": w16}.get(name, words), sc, x
                ref = ref16 if name == "fp16" else ref8
                cx = constexprs(name)
                rpt = cx["R"]
                L1 = int(tiles_name == "l1")
                run1 = lambda: task_form[(P,)](*a, out, T, NT, flag, num_warps=4, num_stages=1, L1=L1, **cx)
                rows.append(time_tiles(run1, out, ref, min(NT, P * T) * rpt, args, tiles=tiles_name, form=name,
                                       P=P, tiles_per_program=T))
    report(f"{props.name}: 32 KB tiles (FP8 16 x {K}, fp16 8 x {K}); hbm: {nt} distinct tiles; l2: {args.l2_tiles} "
           "tiles reread; l1: each program its own tile", props.name, rows, args.out)


if __name__ == "__main__":
    ap = tile_probe_args(__doc__, "tiles read per launch from the l2 and l1 sets")
    ap.add_argument("--interpret", action="store_true")
    a = ap.parse_args()
    if a.compile_only:
        compile_only()
    elif a.interpret:
        interpret_check()
    else:
        run(a)

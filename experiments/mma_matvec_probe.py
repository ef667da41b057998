"""Probe (one H200): fp16 and FP8 weight tiles' products on tensor cores straight from registers, W as A.

kogc's fp16 matvec (a 8 x 2048 tile) spends a thread 512 sm_90 instructions a tile (weights widened to fp32
and multiplied, HADD2.F32 + FFMA, then row sums across warps); its FP8 one (16 x 2048) 944. Here each load's
words go to `mma.sync.m16n8k16` (f16 x f16, fp32 accumulation) as A from the registers the load put them in:
the packed stream is permuted at packing (`pack`, `pack_fp8`) into A's register order, x's B fragments are
loaded in the same permuted order, four loads' mmas are chained from zero in one inline-PTX call, and the
rows' sums are read from the q = 0 lanes (`mma`, `mma_fp8` say how). Forms: `fp16_ffma` (kogc's), `fp16_mma`,
`fp8_s1` / `fp8_s4` (kogc's FP8, plain order and row groups), `fp8_mma`. Each output is checked against torch
(fp32) by max relative error, out NaN-filled first.

Measured (H200, 2026-12-04, docs/results/2026-12-04/mma-matvec-probe.json): the mma forms were slower at the
kernel's three programs an SM, from HBM and from L2, despite 192 / 360 instructions against 512 / 944
(docs/design.md, Rejected ideas).

    PYTHONPATH=. python experiments/mma_matvec_probe.py --out $OUT/mma-matvec.json
    python experiments/mma_matvec_probe.py --compile-only      # no GPU: sm_90 registers, spills, SASS mix
    python experiments/mma_matvec_probe.py --emulate           # no GPU: the mma forms' fragments, in torch
(The interpreter has no inline assembly: --emulate checks the layout, the GPU run the kernel.)
"""
import os
import sys

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_mma_probe import _ready_wait, report, tile_probe_args, time_tiles, warm_up  # noqa: E402

K = 2048
R = 8                         # fp16 rows of a 32 KB tile (= the mma's N)
C = R * K * 2 // (128 * 16)   # 16-byte loads a thread (16)
def _mma_chain(n: int) -> str:
    """PTX for n chained mmas from zero, A the weights: inputs $4 + 4 j .. the j-th load's four words (A's
    registers), then x's, two words a load (B's two registers)."""
    lines = ["{", ".reg .f32 z;", "mov.b32 z, 0;"]
    for j in range(n):
        w, x = 4 + 4 * j, 4 + 4 * n + 2 * j
        c = "{z, z, z, z}" if j == 0 else "{$0, $1, $2, $3}"
        lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{$0, $1, $2, $3}}, "
                     f"{{${w}, ${w + 1}, ${w + 2}, ${w + 3}}}, {{${x}, ${x + 1}}}, {c};")
    return "\n".join(lines + ["}"])


GROUP = 4                     # loads chained in one inline-asm call (their sums in the tensor core's accumulator)
MMA_CHAIN = tl.constexpr(_mma_chain(GROUP))


@triton.jit
def ffma(W, X, OUT, T, NT, FLAG, K: tl.constexpr, R: tl.constexpr):
    """kogc's fp16 matvec: the tile loaded flat before the wait, reshaped, widened to fp32, times x, summed."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    rows = tl.arange(0, R)
    i = 0
    while i < T:
        t = (p + i * P) % NT
        i += 1
        w = tl.load(W + t.to(tl.int64) * (R * K) + tl.arange(0, R * K), eviction_policy="evict_first")
        _ready_wait(FLAG)
        x = tl.load(X + tl.arange(0, K)).to(tl.float32)
        tl.store(OUT + t * R + rows, tl.sum(tl.reshape(w, [R, K]).to(tl.float32) * x[None, :], 1))


@triton.jit
def _words(P, base, s: tl.constexpr, C: tl.constexpr, G: tl.constexpr):
    """Of each G consecutive loads of a thread, the s-th: [C / G * 512] words, element e at thread (e // 4) % 128."""
    e = tl.arange(0, C // G * 512)
    return tl.load(P + base + (e // 512) * (512 * G) + 512 * s + e % 512, eviction_policy="evict_first")


@triton.jit
def _tile_words(W, t, C: tl.constexpr, G: tl.constexpr):
    """Tile t's words as G = 4 tensors, the s-th holding each thread's loads s, s + G, ... (_words)."""
    base = t.to(tl.int64) * (C * 512)
    return _words(W, base, 0, C, G), _words(W, base, 1, C, G), _words(W, base, 2, C, G), _words(W, base, 3, C, G)


@triton.jit
def _xwords(X, s: tl.constexpr, C: tl.constexpr, G: tl.constexpr):
    """x's words for loads s and s + 1 of each G (B's two registers each), from memory: for load c, thread
    32 w + 4 g + q reads words 16 (16 w + c) + 4 q + 2 (g % 2) + 0, 1 (g = 0: row g's columns of A, g = 1: row
    g + 8's; the other columns of B are not read back)."""
    e = tl.arange(0, C // G * 512)
    th = (e // 4) % 128
    c = G * (e // 512) + s + (e % 4) // 2
    idx = 16 * (16 * (th // 32) + c) + 4 * (th % 4) + 2 * ((th // 4) % 2) + e % 2
    return tl.load(X + tl.max_contiguous(tl.multiple_of(idx, 2), 2))


@triton.jit
def mma(W, X, OUT, T, NT, FLAG, C: tl.constexpr, G: tl.constexpr):
    """W: the packed tiles as int32 words (fp16 pairs), [NT, C, 128 threads, 4] (`pack`): thread 32 w + 4 g + q's
    load c is row g's columns 32 m + 8 q .. + 7 (m = 16 w + c) as one mma's A: its registers 0 and 2, A's row g
    (k 2q .. and 2q + 8 ..), columns 8 q + 0 .. 3; registers 1 and 3, A's row g + 8, which is row g again at
    columns 8 q + 4 .. 7. B's column 0 is x at the first four columns, column 1 at the other four (the other
    columns of B are not read back). D[g][0] + D[g + 8][1] (a thread with q = 0: registers 0 and 3) is row g's
    sum. G = 4 loads chained in one call."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    j = 0
    while j < T:
        t = (p + j * P) % NT
        j += 1
        w0, w1, w2, w3 = _tile_words(W, t, C, G)
        _ready_wait(FLAG)
        x01 = _xwords(X, 0, C, G)
        x23 = _xwords(X, 2, C, G)
        d = tl.inline_asm_elementwise(MMA_CHAIN, "=r,=r,=r,=r" + ",r" * 24, [w0, w1, w2, w3, x01, x23],
                                      dtype=tl.float32, is_pure=True, pack=4)
        dsum = tl.reshape(tl.sum(tl.reshape(d, [C // G, 512]), 0), [4, 8, 4, 4])   # [w, g, q, register]
        q = tl.arange(0, 4)
        keep = (q[:, None] == 0) & ((q[None, :] == 0) | (q[None, :] == 3))
        rows = tl.sum(tl.sum(tl.sum(tl.where(keep[None, None, :, :], dsum, 0.0), 3), 2), 0)   # [8 g]
        tl.store(OUT + t * 8 + tl.arange(0, 8), rows)


def pack(w):
    """[NT, 8, K] fp16 tiles -> int32 words [NT, C, 128, 4]: thread 32 w + 4 g + q's load c is row g's columns
    32 (16 w + c) + 8 q .. + 7, as words (columns) 0, 1 / 4, 5 / 2, 3 / 6, 7: A's registers in order."""
    import torch
    nt = w.shape[0]
    pieces = w.reshape(nt, 8, 4, 16, 4, 2, 2, 2)      # [NT, g, w, c, q, half, word, 2 columns]
    return pieces.permute(0, 3, 2, 1, 4, 6, 5, 7).contiguous().view(torch.int32).reshape(nt, C, 128, 4)


def _mma_chain_fp8(n: int) -> str:
    """PTX for 2 n chained mmas from zero on FP8 weights: inputs $4 + 4 j .. the j-th load's four words, each
    two e4m3 pairs (row g's, row g + 8's) unpacked exactly to A's registers; then x's, four words a load."""
    lines = ["{", ".reg .f32 z;", ".reg .b16 l<4>, h<4>;", ".reg .b32 a<8>;", "mov.b32 z, 0;"]
    for j in range(n):
        w, x = 4 + 4 * j, 4 + 4 * n + 4 * j
        for r in range(4):
            lines += [f"mov.b32 {{l{r}, h{r}}}, ${w + r};", f"cvt.rn.f16x2.e4m3x2 a{2 * r}, l{r};",
                      f"cvt.rn.f16x2.e4m3x2 a{2 * r + 1}, h{r};"]
        for k in range(2):
            c = "{z, z, z, z}" if j == 0 and k == 0 else "{$0, $1, $2, $3}"
            a = ", ".join(f"a{4 * k + i}" for i in range(4))
            lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{$0, $1, $2, $3}}, {{{a}}}, "
                         f"{{${x + 2 * k}, ${x + 2 * k + 1}}}, {c};")
    return "\n".join(lines + ["}"])


MMA_CHAIN_FP8 = tl.constexpr(_mma_chain_fp8(GROUP))


@triton.jit
def _x8_index(s: tl.constexpr, C: tl.constexpr, G: tl.constexpr):
    """x's words for an FP8 load s of each G: for load c, thread 32 w + 4 g + q reads words 16 (16 w + c) + 4 q
    + 0 .. 3 (every column of B the same x)."""
    e = tl.arange(0, C // G * 512)
    th = (e // 4) % 128
    return 16 * (16 * (th // 32) + G * (e // 512) + s) + 4 * (th % 4) + e % 4


@triton.jit
def _xwords8(X, s: tl.constexpr, C: tl.constexpr, G: tl.constexpr):
    """x's words for the FP8 form (_x8_index), from memory."""
    return tl.load(X + tl.max_contiguous(tl.multiple_of(_x8_index(s, C, G), 4), 4))


@triton.jit
def mma_fp8(W, S, X, OUT, T, NT, FLAG, C: tl.constexpr, G: tl.constexpr):
    """FP8 tiles of 16 x 2048 (`pack_fp8`): thread 32 w + 4 g + q's load c holds rows g and g + 8 at columns
    32 m + 8 q .. + 7 (m = 16 w + c), A of two mmas once unpacked; rows g and g + 8 are D[g][0] and D[g + 8][0]
    (a thread with q = 0: registers 0 and 2), times the rows' scales."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    r16 = tl.arange(0, 16)
    j = 0
    while j < T:
        t = (p + j * P) % NT
        j += 1
        w0, w1, w2, w3 = _tile_words(W, t, C, G)
        sc = tl.load(S + t * 16 + r16)
        _ready_wait(FLAG)
        x0 = _xwords8(X, 0, C, G)
        x1 = _xwords8(X, 1, C, G)
        x2 = _xwords8(X, 2, C, G)
        x3 = _xwords8(X, 3, C, G)
        d = tl.inline_asm_elementwise(MMA_CHAIN_FP8, "=r,=r,=r,=r" + ",r" * 32, [w0, w1, w2, w3, x0, x1, x2, x3],
                                      dtype=tl.float32, is_pure=True, pack=4)
        dsum = tl.reshape(tl.sum(tl.reshape(d, [C // G, 512]), 0), [4, 8, 4, 2, 2])   # [w, g, q, hi, lo]
        q = tl.arange(0, 4)
        lo = tl.arange(0, 2)
        keep = (q[:, None, None] == 0) & (lo[None, None, :] == 0)
        gh = tl.sum(tl.sum(tl.sum(tl.where(keep[None, None, :, :, :], dsum, 0.0), 4), 2), 0)   # [8 g, 2 hi]
        tl.store(OUT + t * 16 + r16, tl.reshape(tl.permute(gh, [1, 0]), [16]) * sc)


def pack_fp8(q8):
    """[NT, 16, K] e4m3 bytes -> int32 words [NT, C, 128, 4]: thread 32 w + 4 g + q's load c is, for columns
    32 (16 w + c) + 8 q + 2 j, + 1 (word j), row g's two bytes then row g + 8's."""
    import torch
    nt = q8.shape[0]
    b = q8.view(torch.uint8).reshape(nt, 2, 8, 4, 16, 4, 4, 2)   # [NT, hi, g, w, c, q, j, e]
    return b.permute(0, 4, 3, 2, 5, 6, 1, 7).reshape(nt, C * 128 * 16).view(torch.int32).reshape(nt, C, 128, 4)


def _half_pairs(words):
    """int32 words -> their two fp16 halves each, as fp32: [..., 2]."""
    import torch
    return words.contiguous().view(torch.float16).float().reshape(*words.shape, 2)


def emulate():
    """The mma forms' data movement on the CPU (the interpreter has no inline assembly): each thread's A and B
    registers taken from the packed stream and the x indices the kernels use, the m16n8k16 fragments as PTX
    defines them (A: a0 row g, k 2q + 0, 1; a1 row g + 8; a2 row g, k 2q + 8, 9; a3 row g + 8. B: b0 k 2q + 0, 1,
    column g; b1 k 2q + 8, 9. D: d0, d1 row g, columns 2q, 2q + 1; d2, d3 row g + 8), the rows read back as
    the kernels do; against torch."""
    import torch
    torch.manual_seed(0)
    w = torch.randn(2, R, K, dtype=torch.float16)
    x = torch.randn(K, dtype=torch.float16)
    wf = torch.randn(2, 16, K) * 0.05
    q8 = (wf / (wf.abs().amax(2, keepdim=True) / 448)).to(torch.float8_e4m3fn)
    xw = _half_pairs(x.view(torch.int32))                 # [K / 2, 2]
    for name in ("fp16", "fp8"):
        if name == "fp16":
            a_regs = _half_pairs(pack(w)[1])               # [C, 128, 4 registers, 2]
        else:
            b = pack_fp8(q8)[1].contiguous().view(torch.uint8).reshape(C, 128, 4, 2, 2)   # [.., word, hi, e]
            a_regs = b.view(torch.float8_e4m3fn).float()   # A's registers: word j's pairs (row g, row g + 8)
        acc = torch.zeros(4, 8, 4, 4)                      # [warp, g, q, D register]
        for wp in range(4):
            for c in range(C):
                for k in range(2 if name == "fp8" else 1):
                    A, B = torch.zeros(16, 16), torch.zeros(16, 8)
                    for g in range(8):
                        for q in range(4):
                            th = 32 * wp + 4 * g + q
                            if name == "fp16":
                                a = a_regs[c, th]
                                xi = 16 * (16 * wp + c) + 4 * q + 2 * (g % 2) + torch.arange(2)
                            else:
                                pr = a_regs[c, th, 2 * k:2 * k + 2]        # words 2k, 2k + 1: [2, hi, e]
                                a = torch.stack([pr[0, 0], pr[0, 1], pr[1, 0], pr[1, 1]])
                                xi = 16 * (16 * wp + c) + 4 * q + 2 * k + torch.arange(2)
                            A[g, 2 * q:2 * q + 2], A[g + 8, 2 * q:2 * q + 2] = a[0], a[1]
                            A[g, 2 * q + 8:2 * q + 10], A[g + 8, 2 * q + 8:2 * q + 10] = a[2], a[3]
                            B[2 * q:2 * q + 2, g], B[2 * q + 8:2 * q + 10, g] = xw[xi[0]], xw[xi[1]]
                    D = A @ B
                    for g in range(8):
                        for q in range(4):
                            acc[wp, g, q] += torch.stack([D[g, 2 * q], D[g, 2 * q + 1], D[g + 8, 2 * q],
                                                          D[g + 8, 2 * q + 1]])
        if name == "fp16":
            rows, ref = (acc[:, :, 0, 0] + acc[:, :, 0, 3]).sum(0), w[1].float() @ x.float()
        else:
            rows, ref = torch.cat([acc[:, :, 0, 0].sum(0), acc[:, :, 0, 2].sum(0)]), q8[1].float() @ x.float()
        err = ((rows - ref).abs().max() / ref.abs().max()).item()
        print(f"{name} mma form emulated on the CPU: max relative error {err:.2e} against torch")
        assert err < 1e-5, (name, err)


def kernels():
    """(name, kernel, signature, constexprs) of every form: kogc's fp16 way and the fp16 mma; kogc's FP8 ways
    (plain order, row groups: matvec_layout_probe.task_form) and the FP8 mma."""
    from matvec_layout_probe import task_form
    common = {"OUT": "*fp32", "T": "i32", "NT": "i32", "FLAG": "*i32"}
    lay = {c: "constexpr" for c in ("K", "R", "V", "S", "SCALED")}
    return [
        ("fp16_ffma", ffma, {"W": "*fp16", "X": "*fp16", **common, "K": "constexpr", "R": "constexpr"},
         {"K": K, "R": R}),
        ("fp16_mma", mma, {"W": "*i32", "X": "*i32", **common, "C": "constexpr", "G": "constexpr"},
         {"C": C, "G": GROUP}),
        ("fp8_s1", task_form, {"W": "*fp8e4nv", "SC": "*fp32", "X": "*fp16", **common, **lay},
         {"K": K, "R": 16, "V": 16, "S": 1, "SCALED": 1}),
        ("fp8_s4", task_form, {"W": "*fp8e4nv", "SC": "*fp32", "X": "*fp16", **common, **lay},
         {"K": K, "R": 16, "V": 16, "S": 4, "SCALED": 1}),
        ("fp8_mma", mma_fp8, {"W": "*i32", "S": "*fp32", "X": "*i32", **common, "C": "constexpr", "G": "constexpr"},
         {"C": C, "G": GROUP}),
    ]


def compile_only():
    from gluon_stream_probe import print_sass_mix
    print_sass_mix(kernels(), ["HMMA", "F2FP", "HADD2.F32", "FFMA", "FADD", "SHFL", "BAR", "STS", "LDS", "LDG"])


def run(args):
    import torch
    from matvec_layout_probe import pack as pack_groups
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    torch.manual_seed(0)
    nt = args.gib * (1 << 30) // (32 * 1024)
    w16 = torch.randn(nt, R, K, device=dev, dtype=torch.float16)
    x = torch.randn(K, device=dev, dtype=torch.float16)
    ref16 = torch.cat([blk.float() @ x.float() for blk in w16.split(4096)]).reshape(-1)
    wf = torch.randn(nt, 16, K, device=dev) * 0.05
    sc = wf.abs().amax(2) / 448.0
    q8 = (wf / sc[:, :, None]).to(torch.float8_e4m3fn)
    del wf
    ref8 = torch.cat([(b.float() * s[:, :, None]) @ x.float() for b, s in zip(q8.split(4096), sc.split(4096))]).reshape(-1)
    data = {"fp16_ffma": (w16, x), "fp16_mma": (torch.cat([pack(b) for b in w16.split(4096)]), x.view(torch.int32)),
            "fp8_s1": (q8, sc, x),
            "fp8_s4": (pack_groups(q8.view(torch.uint8), 16, 4).view(torch.float8_e4m3fn), sc, x),
            "fp8_mma": (torch.cat([pack_fp8(b) for b in q8.split(4096)]), sc, x.view(torch.int32))}
    out = torch.empty(nt * 16, device=dev, dtype=torch.float32)
    flag = torch.zeros(1, device=dev, dtype=torch.int32)
    warm_up(args.warm_s)
    rows = []
    for rnd in range(args.rounds):
        for tiles_name, NT in (("hbm", nt), ("l2", args.l2_tiles)):
            for P in args.programs:
                T = max(1, (nt if tiles_name == "hbm" else args.reads) // P)
                for name, fn, _, cx in kernels():
                    a = data[name]
                    run1 = lambda: fn[(P,)](*a, out, T, NT, flag, num_warps=4, num_stages=1, **cx)
                    ref, rpt = (ref16, R) if name.startswith("fp16") else (ref8, 16)
                    rows.append(time_tiles(run1, out, ref, min(NT, P * T) * rpt, args, tiles=tiles_name, form=name,
                                           P=P, tiles_per_program=T, round=rnd))
    report(f"{props.name}: 32 KB tiles (fp16 8 x {K}, FP8 16 x {K}); hbm: {nt} distinct tiles; l2: {args.l2_tiles} "
           f"tiles reread; {args.rounds} rounds", props.name, rows, args.out)


if __name__ == "__main__":
    ap = tile_probe_args(__doc__)
    ap.add_argument("--emulate", action="store_true", help="no GPU: the mma forms' fragments emulated")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if a.compile_only:
        compile_only()
    elif a.emulate:
        emulate()
    else:
        run(a)

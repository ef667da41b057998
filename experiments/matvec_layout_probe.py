"""Probe (one H200): a matvec tile's rows owned by warps, so that its row sums need no cross-warp step.

kogc loads a task's 32 KB tile flat (16 bytes a thread a load, consecutive threads on consecutive 16-byte
chunks) and reshapes it to [R, K]: each thread then holds every row's values at 16 (FP8) or 8 (fp16) columns,
and each row's sum runs through five shuffle levels and a cross-warp step in shared memory (stores, a barrier,
loads), R times. FP8 tiles hold twice fp16's rows at the same bytes, so twice the reductions; the kernel's FP8
products take 2.3-2.8x fp16's for twice the weights (docs/fp8.md), and the FP8 widening probe
(`fp8_unpack_probe.py`) found a tile's time on an SM in proportion to its instructions.

The grouped forms (`S` = 2 or 4 row groups) pack the tile's bytes in another order (at compile time, free):
the same flat load leaves each group of 128 / S threads R / S whole rows and each thread R / S rows x
S K / 128 columns. With S = 4 a group is a warp: a row's sum is the thread's own products, then five shuffle
levels inside the warp, no shared memory; with S = 2 it crosses two warps. x is taken in the same column
order (S K / 128 values a thread instead of 16 or 8: more registers). kogc streams FP8 tiles with S = 4
(`kogc.scheduler.tasks.row_groups`). Each form is timed once a round, after a few seconds of matrix
products (so that none is timed at idle clocks).

    PYTHONPATH=. python experiments/matvec_layout_probe.py --out $OUT/matvec-layout.json
    python experiments/matvec_layout_probe.py --compile-only   # no GPU: sm_90 registers, spills, SASS mix
    python experiments/matvec_layout_probe.py --interpret      # no GPU: each form against torch
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
THREADS = tl.constexpr(128)     # 4 warps


@triton.jit
def _products(w, x, R: tl.constexpr, K: tl.constexpr, V: tl.constexpr, S: tl.constexpr):
    """The rows' sums of one tile (unscaled), in the order of `pack` below: S groups of 128 / S threads,
    group s = t // (128 / S) owning rows (R / S) s + b, its thread u = t % (128 / S) columns
    c u + V a + j (c = S K / 128 of them) of chunk i = A b + a. S = 1: kogc's order, the tile reshaped to
    [R, K] (every thread a part of every row: the sums cross warps); S = 4 gives each warp whole rows."""
    if S == 1:
        return tl.sum(tl.reshape(w, [R, K]).to(tl.float32) * x[None, :], 1)
    else:
        RB: tl.constexpr = R // S
        U: tl.constexpr = THREADS // S
        A: tl.constexpr = K // (U * V)
        w5 = tl.reshape(w, [RB, A, S, U, V]).to(tl.float32)
        x3 = tl.permute(tl.reshape(x, [U, A, V]), [1, 0, 2])
        part = tl.sum(tl.sum(w5 * x3[None, :, None, :, :], 4), 1)      # [RB, S, U]: a thread's own sums
        sums = tl.sum(part, 2)                                           # [RB, S]: inside each group
        return tl.reshape(tl.permute(sums, [1, 0]), [R])


@triton.jit
def task_form(W, SC, X, OUT, T, NT, FLAG, K: tl.constexpr, R: tl.constexpr, V: tl.constexpr,
              S: tl.constexpr, SCALED: tl.constexpr):
    """Tile i of program p is (p + i * P) % NT: loaded flat before a ready wait, as a kernel task's is, then
    _products; SCALED (FP8): times each row's scale, loaded with the tile."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    rows = tl.arange(0, R)
    N: tl.constexpr = R * K
    i = 0
    while i < T:        # (a while loop: the interpreter's range() refuses a scalar argument)
        t = (p + i * P) % NT
        i += 1
        w = tl.load(W + t.to(tl.int64) * N + tl.arange(0, N), eviction_policy="evict_first")
        if SCALED:
            s = tl.load(SC + t * R + rows)
        else:
            s = 1.0
        _ready_wait(FLAG)
        x = tl.load(X + tl.arange(0, K)).to(tl.float32)
        tl.store(OUT + t * R + rows, _products(w, x, R, K, V, S) * s)


def pack(tiles, V: int, S: int):
    """[NT, R, K] tiles in the order of S groups (each flattened): element ((R / S) s + b, c u + V a + j) at
    (128 V) (A b + a) + V ((128 / S) s + u) + j. S = 1: kogc's order, the tiles as they are."""
    nt, r, k = tiles.shape
    if S == 1:
        return tiles.reshape(nt, r * k).contiguous()
    u = THREADS.value // S
    a = k // (u * V)
    return tiles.reshape(nt, S, r // S, u, a, V).permute(0, 2, 4, 1, 3, 5).reshape(nt, r * k).contiguous()


TYPES = {"fp8": ("*fp8e4nv", 1), "fp16": ("*fp16", 2)}     # W's type, bytes an element


def forms(fmts=("fp8", "fp16"), cols=(K,), groups=(1, 2, 4)) -> dict:
    """name -> (W's type, rows R, columns K, elements a 16-byte chunk V, row groups S, SCALED) for 32 KB tiles;
    a grouping that gives no thread whole chunks of its rows is left out (S = 1, the plain order, always fits)."""
    out = {}
    for f in fmts:
        wty, esize = TYPES[f]
        for k in cols:
            r, v = 32768 // (k * esize), 16 // esize
            for g in groups:
                if g == 1 or (r % g == 0 and k % (THREADS.value // g * v) == 0):
                    name = f"{f}_s{g}" if len(cols) == 1 else f"{f}_{r}x{k}_s{g}"
                    out[name] = (wty, r, k, v, g, int(f == "fp8"))
    return out


FORMS = forms()


def constexprs(name):
    _, r, k, v, s, sc = FORMS[name]
    return {"K": k, "R": r, "V": v, "S": s, "SCALED": sc}


def tiles_for(name, nt, device):
    """Random tiles of the form's format, the stream as the form reads it, row scales, the fp32 weights and x."""
    import torch
    _, r, k, v, groups, sc = FORMS[name]
    if sc:
        wf = torch.randn(nt, r, k, device=device) * 0.05
        scale = wf.abs().amax(2) / 448.0
        q = (wf / scale[:, :, None]).to(torch.float8_e4m3fn)
        deq = q.float() * scale[:, :, None]
    else:
        q = torch.randn(nt, r, k, device=device, dtype=torch.float16)
        scale = torch.ones(nt, r, device=device)
        deq = q.float()
    stream = pack(q.view(torch.uint8) if sc else q, v, groups)
    if sc:
        stream = stream.view(torch.float8_e4m3fn)
    return stream.reshape(-1), scale.reshape(-1), deq, torch.randn(k, device=device, dtype=torch.float16)


def interpret_check():
    import torch
    torch.manual_seed(0)
    nt = 3
    flag = torch.zeros(1, dtype=torch.int32)
    for name in FORMS:
        stream, scale, deq, x = tiles_for(name, nt, "cpu")
        ref = (deq @ x.float()).reshape(-1)
        out = torch.full((ref.numel(),), float("nan"))
        task_form[(nt,)](stream, scale, x, out, 1, nt, flag, **constexprs(name))
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        print(f"{name:<16} under the interpreter: max relative error {err:.2e} against torch ({nt} tiles)")
        assert err < 1e-5, (name, err)


def compile_only():
    from gluon_stream_probe import print_sass_mix
    ops = ["F2FP", "HADD2.F32", "FFMA", "FADD", "FMUL", "SHFL", "BAR", "STS", "LDS", "LDG", "PRMT"]
    rows = []
    for name, (wty, *_) in FORMS.items():
        sig = {"W": wty, "SC": "*fp32", "X": "*fp16", "OUT": "*fp32", "T": "i32", "NT": "i32", "FLAG": "*i32",
               **{c: "constexpr" for c in ("K", "R", "V", "S", "SCALED")}}
        rows.append((name, task_form, sig, constexprs(name)))
    print_sass_mix(rows, ops)


def run(args):
    import torch
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    torch.manual_seed(0)
    nt = args.gib * (1 << 30) // (32 * 1024)
    flag = torch.zeros(1, device=dev, dtype=torch.int32)
    data = {}
    for name in FORMS:
        stream, scale, deq, x = tiles_for(name, nt, dev)
        ref = torch.cat([blk @ x.float() for blk in deq.split(4096)]).reshape(-1)
        del deq
        data[name] = stream, scale, x, ref, torch.empty(ref.numel(), device=dev, dtype=torch.float32)
    warm_up(args.warm_s)
    rows = []
    for rnd in range(args.rounds):       # every form once a round: drift in clocks spreads over all of them
        for tiles_name in ("hbm", "l2"):
            for P in args.programs:
                for name in FORMS:
                    stream, scale, x, ref, out = data[name]
                    cx = constexprs(name)
                    NT = nt if tiles_name == "hbm" else args.l2_tiles
                    T = max(1, (nt if tiles_name == "hbm" else args.reads) // P)
                    run1 = lambda: task_form[(P,)](stream, scale, x, out, T, NT, flag, num_warps=4, num_stages=1,
                                                   **cx)
                    rows.append(time_tiles(run1, out, ref, min(NT, P * T) * cx["R"], args, tiles=tiles_name,
                                           form=name, P=P, tiles_per_program=T, round=rnd))
    report(f"{props.name}: 32 KB tiles; hbm: {nt} distinct tiles; l2: {args.l2_tiles} tiles reread; {args.rounds} rounds",
           props.name, rows, args.out)


if __name__ == "__main__":
    ap = tile_probe_args(__doc__)
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--formats", nargs="+", default=["fp8", "fp16"], choices=sorted(TYPES))
    ap.add_argument("--cols", type=int, nargs="+", default=[K], help="columns K of the tiles (rows: 32 KB of them)")
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4], help="row groups S (1: kogc's plain order)")
    a = ap.parse_args()
    FORMS = forms(a.formats, a.cols, a.groups)
    if a.compile_only:
        compile_only()
    elif a.interpret:
        interpret_check()
    else:
        run(a)

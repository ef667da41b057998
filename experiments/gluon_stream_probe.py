"""Probe (one H200): can a shared-memory ring filled by TMA keep HBM streaming with few programs?

A persistent grid of P programs reads a large fp16 weight buffer (>= 2 GiB), each program its own
contiguous run of tiles. A tile is 32 KB: R=8 rows of K=2048 fp16. Per tile a program does the work
of a decode matvec: the tile times a vector x of K fp16 (held in registers), fp32 accumulation, one
fp32 output per row stored to global memory. Reported: GB/s of weight bytes read.

- triton:      plain Triton, the way kogc's kernel streams weights: tl.load of a tile into
               registers, compute, store, next tile (num_stages=1: one tile in flight per program).
- triton_cpa:  the same source with tl.range(num_stages=S): Triton's own software pipeliner may turn
               the loads into a cp.async ring of S stages in shared memory (compile-only says
               whether it did: shared memory > 0).
- gluon_tma:   Gluon, warp-specialized. A loader partition (1 warp) issues one TMA copy per tile into
               a ring of S stages (32 KB each) and arms the stage's "ready" mbarrier with the byte
               count; the default partition (4 warps) waits on "ready", reads the tile from shared
               memory, arrives on the stage's "empty" mbarrier so the loader can refill it, then
               computes and stores. S tiles (S*32 KB) are in flight per program with no registers
               held for them.

TMA boxes are at most 256 elements a side, so the weights are described to TMA as [rows, 8, 256]
(a row as 8 chunks of 256) and a tile is one [8, 8, 256] box, unswizzled: one copy, 32 KB dense.

P defaults to 66, 132, 264 on the H200's 132 SMs: half the SMs, one program per SM, two per SM.
Shared memory: an SM has 227 KB for blocks; S=4 is 128 KB per program, so P=264 fits only for
S <= 3. Combinations that cannot be co-resident are skipped (ok=null, with a note), not timed: a
second wave would measure the scheduler, not the pipeline. Registers: the Gluon kernel runs 4+1
warps, rounded up to 8; maxnreg=128 (setmaxnreg then gives compute 232, loader 24) keeps two
programs per SM possible.

Verification: each variant's output vs a torch fp32 matvec on the GPU, max |out - ref| <= 1e-3 *
max |ref|, on random data; out is NaN-filled first, so a row left unwritten fails. A wrong result
is reported (ok=false, with its error) and not timed. Timing: torch.cuda events around single
launches after a warm-up, median of --iters.

    PYTHONPATH=. python experiments/gluon_stream_probe.py --out $OUT/stream.json
    python experiments/gluon_stream_probe.py --compile-only     # no GPU: compile all for sm_90

What a result would mean for kogc: the generated kernel streams weights the "triton" way, so one
program per SM has only the loads of one tile (plus what its warps overlap) in flight. If gluon_tma
at P=132, or even P=66, reaches the HBM rate (~4 TB/s and up) that "triton" reaches only with more
programs per SM, then a TMA ring decouples streaming from compute: a loader warp keeps S tiles in
flight while the compute warps do anything else, including waiting on a dependency, and the
generated kernel would want a loader partition per program. If "triton" at P=132 already matches
it, the register path suffices for streaming; if "triton_cpa" matches it, Triton's own pipeliner
gets the same without Gluon.
"""
import argparse
import json
import re
import statistics
import tempfile
from functools import partial

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

K, R = 2048, 8            # a tile: R rows of K fp16 = 32 KB
C, B = 8, 256             # a row seen as C chunks of B: TMA boxes are at most 256 elements a side
TILE_BYTES = R * K * 2
WARPS = 4
SMEM_PER_SM = 227 * 1024
# No swizzle: a [R, C, B] box is then one dense 32 KB block, and rows of 512 B read by a warp's
# 32 lanes x 16 B are bank-conflict free anyway.
W_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)


# --------------------------------------------------------------------------- (a) plain Triton
@triton.jit
def triton_stream_kernel(w_ptr, x_ptr, out_ptr, tiles_per_prog, K: tl.constexpr, R: tl.constexpr,
                         STAGES: tl.constexpr):
    first = tl.program_id(0) * tiles_per_prog
    k = tl.arange(0, K)
    rows = tl.arange(0, R)
    x = tl.load(x_ptr + k).to(tl.float32)
    for i in tl.range(0, tiles_per_prog, num_stages=STAGES):
        row0 = (first + i).to(tl.int64) * R          # 64-bit: the buffer is over 2 GiB
        w = tl.load(w_ptr + (row0 + rows[:, None]) * K + k[None, :])
        tl.store(out_ptr + row0 + rows, tl.sum(w.to(tl.float32) * x[None, :], axis=1))


# --------------------------------------------------------------------------- (b) Gluon + TMA ring
@gluon.jit
def _tma_loader(w_desc, ring, ready, empty, first, n):
    S: gl.constexpr = ring.shape[0]
    RB: gl.constexpr = w_desc.block_type.shape[0]
    for i in range(n):
        s = i % S
        # Wait until the compute warps freed stage s. A fresh mbarrier counts as having completed
        # phase 1, so the first S waits (phase 1) pass at once and the ring fills.
        mbarrier.wait(empty.index(s), ((i // S) & 1) ^ 1)
        mbarrier.expect(ready.index(s), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [(first + i) * RB, 0, 0], ready.index(s), ring.index(s))


@gluon.jit
def _compute(x_ptr, out_ptr, ring, ready, empty, first, n, L3: gl.constexpr):
    S: gl.constexpr = ring.shape[0]
    RB: gl.constexpr = ring.shape[1]
    CB: gl.constexpr = ring.shape[2]
    BB: gl.constexpr = ring.shape[3]
    XL: gl.constexpr = gl.SliceLayout(0, L3)                      # x as [C, B], broadcast over rows
    OL: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L3))   # one value per row
    c = gl.arange(0, CB, layout=gl.SliceLayout(1, XL))
    b = gl.arange(0, BB, layout=gl.SliceLayout(0, XL))
    x = gl.load(x_ptr + c[:, None] * BB + b[None, :]).to(gl.float32)
    rows = gl.arange(0, RB, layout=OL)
    for i in range(n):
        s = i % S
        mbarrier.wait(ready.index(s), (i // S) & 1)
        w = ring.index(s).load(L3)
        # Order our generic-proxy reads before the loader's next async-proxy (TMA) write, then
        # give the stage back: the loader refills it while we compute. One thread arrives; the
        # compiler puts a bar.sync of the 4 warps before it (checked in the PTX), so all have read.
        fence_async_shared()
        mbarrier.arrive(empty.index(s), count=1)
        acc = gl.sum(gl.sum(w.to(gl.float32) * x[None, :, :], axis=2), axis=1)
        gl.store(out_ptr + (first + i).to(gl.int64) * RB + rows, acc)


@gluon.jit
def new_ring(w_desc, S: gl.constexpr):
    """S shared-memory stages of the descriptor's tile, each with a barrier for filled (ready) and one
    for free (empty)."""
    ring = gl.allocate_shared_memory(w_desc.dtype, [S] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(S):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    return ring, ready, empty


@gluon.jit
def retire_ring(ready, empty, S: gl.constexpr):
    for s in gl.static_range(S):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


@gluon.jit
def gluon_ring_kernel(w_desc, x_ptr, out_ptr, tiles_per_prog, S: gl.constexpr, WARPS: gl.constexpr):
    ring, ready, empty = new_ring(w_desc, S)
    first = gl.program_id(0) * tiles_per_prog
    # A warp reads 32 lanes x 8 fp16 = one 512 B chunk of a row; warps split the chunks.
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [1, WARPS, 1], [2, 1, 0])
    gl.warp_specialize([
        (_compute, (x_ptr, out_ptr, ring, ready, empty, first, tiles_per_prog, L3)),
        (_tma_loader, (w_desc, ring, ready, empty, first, tiles_per_prog)),
    ], [1], [24])
    retire_ring(ready, empty, S)


# --------------------------------------------------------------------------- the variants
def variants(stages):
    """(name, S, kernel, launch options) for every kernel the probe runs."""
    out = [("triton", 1, triton_stream_kernel, dict(num_warps=WARPS, num_stages=1))]
    out += [("triton_cpa", s, triton_stream_kernel, dict(num_warps=WARPS, num_stages=s)) for s in stages]
    out += [("gluon_tma", s, gluon_ring_kernel, dict(num_warps=WARPS, maxnreg=128)) for s in stages]
    return out


# The host TensorDescriptor of the weights specializes to this type string; it carries the smem layout.
W_DESC_TYPE = f"tensordesc<fp16[{R}, {C}, {B}],{W_LAYOUT!r}>"
ALIGNED = [["tt.divisibility", 16]]


def compile_sm90(fn, sig: dict, constexprs: dict, opts: dict, gluon: bool, attrs: dict | None = None):
    """Compile a Triton (or, with gluon, a Gluon) kernel for sm_90 without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    src = (GluonASTSource if gluon else triton.compiler.ASTSource)(fn, sig, constexprs, attrs or {})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def median_launch_us(launch, warmup: int, iters: int, reset=None) -> float:
    """Median device time of `launch()` in us over `iters` launches after `warmup` (CUDA events around
    each; `reset()` before each launch, outside the timing)."""
    import torch
    times = []
    for it in range(warmup + iters):
        if reset is not None:
            reset()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        launch()
        b.record()
        b.synchronize()
        if it >= warmup:
            times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def _aot(name, S, fn, opts):
    if name == "gluon_tma":
        sig = {"w_desc": W_DESC_TYPE, "x_ptr": "*fp16", "out_ptr": "*fp32", "tiles_per_prog": "i32",
               "S": "constexpr", "WARPS": "constexpr"}
        return compile_sm90(fn, sig, {"S": S, "WARPS": WARPS}, opts, True, {(1,): ALIGNED, (2,): ALIGNED})
    sig = {"w_ptr": "*fp16", "x_ptr": "*fp16", "out_ptr": "*fp32", "tiles_per_prog": "i32",
           "K": "constexpr", "R": "constexpr", "STAGES": "constexpr"}
    return compile_sm90(fn, sig, {"K": K, "R": R, "STAGES": opts["num_stages"]}, opts, False,
                        {(i,): ALIGNED for i in range(3)})


def _usage(k):
    """Registers and spill bytes (stores + loads) of a compiled kernel, read by kogc's own summary of
    the bundled ptxas and cuobjdump."""
    from kogc.codegen.aot import disassembly_summary
    with tempfile.TemporaryDirectory() as tmp:
        open(f"{tmp}/k.ptx", "w").write(k.asm["ptx"])
        open(f"{tmp}/k.cubin", "wb").write(k.asm["cubin"])
        u = disassembly_summary({"ptx": f"{tmp}/k.ptx", "cubin": f"{tmp}/k.cubin"})
    spill = u.get("spill_store_bytes", 0) + u.get("spill_load_bytes", 0) if "spill_store_bytes" in u else None
    return u.get("registers"), spill


def sass_mix(fn, sig: dict, constexprs: dict, ops: list[str], num_warps: int = 4) -> tuple:
    """A Triton kernel compiled for sm_90 (pointer arguments 16-byte aligned): its registers, spill bytes, the
    count of each SASS opcode in `ops` (with its variants, e.g. HADD2.F32) and of all instructions."""
    import os
    import subprocess
    k = compile_sm90(fn, sig, constexprs, dict(num_warps=num_warps, num_stages=1), False,
                     {(j,): ALIGNED for j, ty in enumerate(sig.values()) if ty.startswith("*")})
    regs, spill = _usage(k)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        open(f"{tmp}/k.cubin", "wb").write(k.asm["cubin"])
        sass = subprocess.run([cuobjdump, "-sass", f"{tmp}/k.cubin"], capture_output=True, text=True).stdout
    ins = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass)
    return regs, spill, [sum(1 for i in ins if i == op or i.startswith(op + ".")) for op in ops], len(ins)


def print_sass_mix(rows: list, ops: list[str]):
    """A table of (name, kernel, signature, constexprs) compiled by sass_mix."""
    print(f"{'kernel':<16}{'regs':>6}{'spill B':>9}  SASS: " + " ".join(ops))
    for name, fn, sig, cx in rows:
        regs, spill, counts, n = sass_mix(fn, sig, cx, ops)
        print(f"{name:<16}{regs!s:>6}{spill!s:>9}  " + " ".join(f"{c}" for c in counts) + f"  ({n} in all)")


def compile_only(stages):
    # regs: what ptxas allots a thread at launch (for Gluon the maxnreg cap); partition regs: what
    # setmaxnreg moves the compute / loader warpgroups to. TMA copies, cp.async: static PTX counts.
    print(f"{'kernel':<12}{'S':>3}{'regs':>6}{'partition regs':>16}{'spill B':>9}{'shared B':>10}{'warps':>7}"
          f"{'TMA copies':>12}{'cp.async':>10}")
    for name, S, fn, opts in variants(stages):
        k = _aot(name, S, fn, opts)
        ptx = k.asm["ptx"]
        regs, spill = _usage(k)
        part = "/".join(sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)),
                               key=lambda v: -int(v))) or "-"
        print(f"{name:<12}{S:>3}{regs!s:>6}{part:>16}{spill!s:>9}{k.metadata.shared:>10}{k.metadata.num_warps:>7}"
              f"{len(re.findall(r'cp.async.bulk.tensor', ptx)):>12}{len(re.findall(r'cp.async.c[ag]', ptx)):>10}")


# --------------------------------------------------------------------------- on the GPU
def run(args):
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    sms = props.multi_processor_count
    n_tiles = int(args.gib * 2**30) // TILE_BYTES
    n_rows = n_tiles * R
    torch.manual_seed(0)
    w = torch.randn(n_rows, K, device=dev, dtype=torch.float16)
    x = torch.randn(K, device=dev, dtype=torch.float16)
    ref = torch.cat([blk.float() @ x.float() for blk in w.split(1 << 16)])     # fp32 reference
    out = torch.empty(n_rows, device=dev, dtype=torch.float32)
    desc = TensorDescriptor(w.view(n_rows, C, B), [n_rows, C, B], [K, B, 1], [R, C, B], W_LAYOUT)

    rows = []
    for name, S, fn, opts in variants(args.stages):
        for P in args.programs:
            T = n_tiles // P
            if name == "gluon_tma":
                launch = partial(fn[(P,)], desc, x, out, T, S=S, WARPS=WARPS, **opts)
            else:
                launch = partial(fn[(P,)], w, x, out, T, K=K, R=R, STAGES=opts["num_stages"], **opts)
            row = dict(variant=name, P=P, S=S, tiles_per_prog=T, GBps=None, ok=None, note="")
            rows.append(row)
            k = launch()                      # compiles; the handle's metadata says shared memory
            resident = SMEM_PER_SM // max(k.metadata.shared, 1)
            row["shared_bytes"] = k.metadata.shared
            if -(-P // sms) > resident:
                row["note"] = f"not co-resident: {P // sms} programs/SM need {k.metadata.shared} B each"
                continue
            out.fill_(float("nan"))
            launch()
            torch.cuda.synchronize()
            got, want = out[:P * T * R], ref[:P * T * R]
            err = ((got - want).abs().max() / want.abs().max()).item()
            row["rel_err"] = err
            row["ok"] = bool(err <= 1e-3)          # NaN (unwritten row) compares False
            if not row["ok"]:
                row["note"] = f"wrong result: max rel err {err:.3g}"
                continue
            row["seconds"] = median_launch_us(launch, args.warmup, args.iters) / 1e6
            row["GBps"] = P * T * TILE_BYTES / row["seconds"] / 1e9

    print(f"{props.name}, {sms} SMs, {n_tiles * TILE_BYTES / 2**30:.2f} GiB of weights")
    print(f"{'variant':<12}{'P':>5}{'S':>3}{'GB/s':>9}{'ok':>6}  note")
    for r in rows:
        gbs = f"{r['GBps']:.0f}" if r["GBps"] else "-"
        print(f"{r['variant']:<12}{r['P']:>5}{r['S']:>3}{gbs:>9}{str(r['ok']):>6}  {r['note']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=props.name, sms=sms, tile_bytes=TILE_BYTES, rows=rows), f, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    ap.add_argument("--compile-only", action="store_true", help="compile every kernel for sm_90, no GPU")
    ap.add_argument("--programs", type=int, nargs="+", default=[66, 132, 264])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--gib", type=float, default=2, help="GiB of fp16 weights streamed")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    compile_only(a.stages) if a.compile_only else run(a)

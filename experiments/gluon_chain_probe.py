"""Probe (one H200): does a TMA weight ring keep HBM busy through a chain of waits, where the kernel's
register form (one tile loaded before each task's wait) does not?

The stream probe (experiments/gluon_stream_probe.py) measured streaming alone. Here the tiles come in
dependent phases, as a one-lane model's layer does: per layer, an idle gap of D us (attention and the
small projections, when HBM streams nothing: program 0 waits for the previous layer's last phase, spins D
us, then raises an event), phase A (NA tiles: W1/W3; each waits for the gap's event) and phase B (NB tiles:
W2; each waits for all of A). Tile i of a phase belongs to program i % P. A task is a decode matvec of one
32 KB tile (R=8 rows of K=2048 fp16) with fp32 accumulation, then a barrier and a release add on its
phase's counter; a wait spins on acquire loads of a counter (bounded: a wait that gives up is recorded).

- triton: the kernel's way: the tile is loaded into registers before the task's wait. Three forms: a wait and
  a publish per tile; triton_pruned, a program's waits after its first of a phase dropped (as the kernel's
  placement does); triton_deferred, pruned and one publish per program and phase, after its last tile,
  adding its number of tiles (what deferred publishes would give the kernel); triton_table and
  triton_table_deferred, pruned, and as the kernel's tasks each reads its table row (an L2 hit) before
  it can address its tile and its input vector after its wait.
- gluon_ring (and gluon_ring_deferred: waits pruned, publishes deferred, as for the register form): a loader warp walks the program's tiles of every phase and layer, one TMA copy per tile into
  a ring of S stages of shared memory, waiting only for a free stage, never for a dependency; the compute
  warps wait for the dependency, then for the stage, compute from shared memory and free it. Through a
  gap, each program holds up to S tiles already loaded.

Reported per variant and gap: us per layer and the weight rate it means. Against them: the layer's bytes
at the streaming rate plus the gap is what no prefetch across the gap gives, the bytes alone (or the gap,
if longer) what a perfect one would. Every output is checked against torch, every wait for giving up, and
every phase counter for counting each task once.

    PYTHONPATH=. python experiments/gluon_chain_probe.py --out $OUT/chain.json
    python experiments/gluon_chain_probe.py --compile-only      # no GPU: compile all for sm_90
"""
import argparse
import json
import os
import sys
from functools import partial

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gluon_stream_probe import (ALIGNED, B, C, K, R, SMEM_PER_SM, TILE_BYTES, W_DESC_TYPE, W_LAYOUT,  # noqa: E402
                                WARPS, _usage, compile_sm90, median_launch_us, new_ring,
                                retire_ring)
from hop_probe import _acquire_at_least, _now  # noqa: E402

LIMIT = 1 << 20           # spins before a wait gives up (about a second)
GAP = tl.constexpr(0)     # a layer's three counters (GAP, PHASE_A, PHASE_B), 32 words (128 B) apart
PHASE_A = tl.constexpr(1)
PHASE_B = tl.constexpr(2)


# --------------------------------------------------------------------------- (a) the kernel's way
@triton.jit
def _wait(cnt, target, bad, limit):
    """Wait for a count (hop_probe's bounded acquire loop); one that gives up is counted in `bad`."""
    if _acquire_at_least(cnt, target, limit, "gpu") == 0:
        tl.atomic_add(bad, 1, sem="relaxed", scope="gpu")


@triton.jit
def _gap(cnt, layer, NB, gap_ns, bad, limit):
    """Program 0: after the previous layer's phase B, an idle gap, then the layer's gap event."""
    if layer > 0:
        _wait(cnt + ((layer - 1) * 3 + PHASE_B) * 32, NB, bad, limit)
    t0 = _now()
    while _now() - t0 < gap_ns:
        pass
    tl.atomic_add(cnt + (layer * 3 + GAP) * 32, 1, sem="release", scope="gpu")


@triton.jit
def chain_triton(w_ptr, x_ptr, out_ptr, tab_ptr, cnt, bad, layers, NA, NB, gap_ns, limit, K: tl.constexpr,
                 R: tl.constexpr, PRUNE: tl.constexpr, DEFER: tl.constexpr, TABLE: tl.constexpr,
                 SLICES: tl.constexpr):
    """PRUNE: a program waits for a phase's dependency before its first tile of the phase only (the kernel
    drops waits its program already knows satisfied). DEFER: a program publishes once per phase, after its
    last tile, adding its number of tiles, instead of a barrier, fence and atomic after every tile (no
    consumer waits longer: each needs every tile of the phase). TABLE: as the kernel's tasks, each reads its
    row of a table (kept in L2) before it can address its tile, and its input vector after its wait.
    SLICES > 0: phase B split over its inputs (W2 as split-K): A's tiles publish to one of SLICES counters
    (tile i to slice i * SLICES // NA) and B's tile j waits only for its slice j * SLICES // NB of A (once
    per slice a program meets); SLICES < 0: B does not wait for A at all (the bound of any such split)."""
    p = tl.program_id(0)
    slice_cnt = cnt + layers * 3 * 32
    P = tl.num_programs(0)
    k = tl.arange(0, K)
    rows = tl.arange(0, R)
    x = tl.load(x_ptr + k).to(tl.float32)
    for layer in range(layers):
        if p == 0:
            _gap(cnt, layer, NB, gap_ns, bad, limit)
        for ph in range(2):
            n = NA if ph == 0 else NB
            base = layer * (NA + NB) + ph * NA
            for i in range(p, n, P):
                if TABLE:
                    row0 = tl.load(tab_ptr + base + i, eviction_policy="evict_last").to(tl.int64) * R
                else:
                    row0 = (base + i).to(tl.int64) * R
                w = tl.load(w_ptr + (row0 + rows[:, None]) * K + k[None, :])     # before the wait
                if SLICES != 0:
                    if ph == 0:
                        if i == p:
                            _wait(cnt + (layer * 3 + GAP) * 32, 1, bad, limit)
                    elif SLICES > 0:
                        sl = i * SLICES // NB
                        if (i == p) or (sl != (i - P) * SLICES // NB):
                            _wait(slice_cnt + (layer * SLICES + sl) * 32, NA // SLICES, bad, limit)
                elif (PRUNE == 0) or (i == p):
                    if ph == 0:
                        _wait(cnt + (layer * 3 + GAP) * 32, 1, bad, limit)
                    else:
                        _wait(cnt + (layer * 3 + PHASE_A) * 32, NA, bad, limit)
                if TABLE:
                    xin = tl.load(x_ptr + k).to(tl.float32)
                else:
                    xin = x
                tl.store(out_ptr + row0 + rows, tl.sum(w.to(tl.float32) * xin[None, :], axis=1))
                if DEFER == 0:
                    tl.debug_barrier()
                    if (SLICES > 0) and (ph == 0):
                        tl.atomic_add(slice_cnt + (layer * SLICES + i * SLICES // NA) * 32, 1, sem="release",
                                      scope="gpu")
                    else:
                        tl.atomic_add(cnt + (layer * 3 + PHASE_A + ph) * 32, 1, sem="release", scope="gpu")
            if DEFER:
                mine = (n - p + P - 1) // P
                if mine > 0:
                    tl.debug_barrier()
                    tl.atomic_add(cnt + (layer * 3 + PHASE_A + ph) * 32, mine, sem="release", scope="gpu")


@triton.jit
def chain_ahead(w_ptr, x_ptr, out_ptr, tab_ptr, cnt, bad, layers, NA, NB, gap_ns, limit, K: tl.constexpr,
                R: tl.constexpr, AHEAD: tl.constexpr):
    """The table form, pruned, software-pipelined across tasks: each task reads the next task's table row
    while it runs (as the kernel's read-ahead did), and loads the next tile into the registers its own
    tile frees: AHEAD 0 after its publish, AHEAD 1 after its products, before its store and publish (the
    next tile streams through the publish's barrier and fence)."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    k = tl.arange(0, K)
    rows = tl.arange(0, R)
    layer = 0
    ph = 0
    i = p
    row0 = tl.load(tab_ptr + i, eviction_policy="evict_last").to(tl.int64) * R
    w = tl.load(w_ptr + (row0 + rows[:, None]) * K + k[None, :])
    while layer < layers:
        n = tl.where(ph == 0, NA, NB)
        ni = i + P
        nph = ph
        nl = layer
        if ni >= n:
            ni = p
            nph = 1 - ph
            nl = layer + ph
        more = nl < layers
        nrow = tl.load(tab_ptr + nl * (NA + NB) + nph * NA + ni, mask=more, other=0, eviction_policy="evict_last")
        nrow0 = nrow.to(tl.int64) * R
        if i == p:
            if ph == 0:
                if p == 0:
                    _gap(cnt, layer, NB, gap_ns, bad, limit)
                _wait(cnt + (layer * 3 + GAP) * 32, 1, bad, limit)
            else:
                _wait(cnt + (layer * 3 + PHASE_A) * 32, NA, bad, limit)
        xin = tl.load(x_ptr + k).to(tl.float32)
        acc = tl.sum(w.to(tl.float32) * xin[None, :], axis=1)
        if AHEAD == 1:
            w = tl.load(w_ptr + (nrow0 + rows[:, None]) * K + k[None, :], mask=more, other=0.0)
        tl.store(out_ptr + row0 + rows, acc)
        tl.debug_barrier()
        tl.atomic_add(cnt + (layer * 3 + PHASE_A + ph) * 32, 1, sem="release", scope="gpu")
        if AHEAD == 0:
            w = tl.load(w_ptr + (nrow0 + rows[:, None]) * K + k[None, :], mask=more, other=0.0)
        row0 = nrow0
        i = ni
        ph = nph
        layer = nl


# --------------------------------------------------------------------------- (b) Gluon, a TMA ring
@gluon.jit
def _g_now():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _g_wait(cnt, target, bad, limit):
    seen = gl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
    n = 0
    while (seen < target) & (n < limit):
        seen = gl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
        n += 1
    if seen < target:
        gl.atomic_add(bad, 1, sem="relaxed", scope="gpu")


@gluon.jit
def _ring_loader(w_desc, ring, ready, empty, layers, NA, NB):
    """Every tile of this program, layer after layer, phase after phase: never waits on a dependency."""
    S: gl.constexpr = ring.shape[0]
    RB: gl.constexpr = w_desc.block_type.shape[0]
    p = gl.program_id(0)
    P = gl.num_programs(0)
    j = 0
    for layer in range(layers):
        for ph in range(2):
            n = NA if ph == 0 else NB
            base = layer * (NA + NB) + ph * NA
            for i in range(p, n, P):
                s = j % S
                mbarrier.wait(empty.index(s), ((j // S) & 1) ^ 1)     # a fresh barrier passes phase 1
                mbarrier.expect(ready.index(s), w_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(w_desc, [(base + i) * RB, 0, 0], ready.index(s), ring.index(s))
                j += 1


@gluon.jit
def _ring_compute(x_ptr, out_ptr, cnt, bad, ring, ready, empty, layers, NA, NB, gap_ns, limit, L3: gl.constexpr,
                  PRUNE: gl.constexpr, DEFER: gl.constexpr):
    S: gl.constexpr = ring.shape[0]
    RB: gl.constexpr = ring.shape[1]
    CB: gl.constexpr = ring.shape[2]
    BB: gl.constexpr = ring.shape[3]
    XL: gl.constexpr = gl.SliceLayout(0, L3)
    OL: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L3))
    c = gl.arange(0, CB, layout=gl.SliceLayout(1, XL))
    b = gl.arange(0, BB, layout=gl.SliceLayout(0, XL))
    x = gl.load(x_ptr + c[:, None] * BB + b[None, :]).to(gl.float32)
    rows = gl.arange(0, RB, layout=OL)
    p = gl.program_id(0)
    P = gl.num_programs(0)
    j = 0
    for layer in range(layers):
        if p == 0:      # the gap: after the previous layer's phase B, idle, then the layer's gap event
            if layer > 0:
                _g_wait(cnt + ((layer - 1) * 3 + PHASE_B) * 32, NB, bad, limit)
            t0 = _g_now()
            while _g_now() - t0 < gap_ns:
                pass
            gl.atomic_add(cnt + (layer * 3 + GAP) * 32, 1, sem="release", scope="gpu")
        for ph in range(2):
            n = NA if ph == 0 else NB
            base = layer * (NA + NB) + ph * NA
            for i in range(p, n, P):
                if (PRUNE == 0) or (i == p):
                    if ph == 0:
                        _g_wait(cnt + (layer * 3 + GAP) * 32, 1, bad, limit)
                    else:
                        _g_wait(cnt + (layer * 3 + PHASE_A) * 32, NA, bad, limit)
                s = j % S
                mbarrier.wait(ready.index(s), (j // S) & 1)
                w = ring.index(s).load(L3)
                fence_async_shared()            # our reads before the loader's next TMA write of the stage
                mbarrier.arrive(empty.index(s), count=1)
                acc = gl.sum(gl.sum(w.to(gl.float32) * x[None, :, :], axis=2), axis=1)
                gl.store(out_ptr + (base + i).to(gl.int64) * RB + rows, acc)
                if DEFER == 0:
                    gl.thread_barrier()
                    gl.atomic_add(cnt + (layer * 3 + PHASE_A + ph) * 32, 1, sem="release", scope="gpu")
                j += 1
            if DEFER:
                mine = (n - p + P - 1) // P
                if mine > 0:
                    gl.thread_barrier()
                    gl.atomic_add(cnt + (layer * 3 + PHASE_A + ph) * 32, mine, sem="release", scope="gpu")


@gluon.jit
def chain_ring(w_desc, x_ptr, out_ptr, cnt, bad, layers, NA, NB, gap_ns, limit, S: gl.constexpr,
               WARPS: gl.constexpr, PRUNE: gl.constexpr, DEFER: gl.constexpr):
    ring, ready, empty = new_ring(w_desc, S)
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [1, WARPS, 1], [2, 1, 0])
    gl.warp_specialize([
        (_ring_compute, (x_ptr, out_ptr, cnt, bad, ring, ready, empty, layers, NA, NB, gap_ns, limit, L3, PRUNE,
                         DEFER)),
        (_ring_loader, (w_desc, ring, ready, empty, layers, NA, NB)),
    ], [1], [24])
    retire_ring(ready, empty, S)


# --------------------------------------------------------------------------- variants
# the register form: as written above (a wait and a publish per tile), with waits pruned as the kernel
# does, and with waits pruned and publishes deferred to a program's last tile of a phase
TRITON_FORMS = (("triton", 0, 0, 0), ("triton_pruned", 1, 0, 0), ("triton_deferred", 1, 1, 0),
                ("triton_table", 1, 0, 1), ("triton_table_deferred", 1, 1, 1))
# phase B split over its inputs: the table form, pruned, B's tiles waiting for their slice of A (or not at all)
SPLIT_FORMS = tuple((f"triton_table_split{n}" if n > 0 else "triton_table_nowait", n) for n in (4, 8, 16, -1))
# the ring: a wait per tile and a publish per tile, or waits pruned and publishes deferred as above
RING_FORMS = (("gluon_ring", 0, 0), ("gluon_ring_deferred", 1, 1))

def variants(ring_stages):
    out = [(name, 1, chain_triton, dict(num_warps=WARPS, num_stages=1, PRUNE=prune, DEFER=defer, TABLE=table,
                                        SLICES=0))
           for name, prune, defer, table in TRITON_FORMS]
    out += [(name, 1, chain_triton, dict(num_warps=WARPS, num_stages=1, PRUNE=1, DEFER=0, TABLE=1, SLICES=n))
            for name, n in SPLIT_FORMS]
    out += [(f"triton_ahead{a}", 1, chain_ahead, dict(num_warps=WARPS, num_stages=1, AHEAD=a)) for a in (0, 1)]
    out += [(name, s, chain_ring, dict(num_warps=WARPS, maxnreg=128, PRUNE=prune, DEFER=defer))
            for name, prune, defer in RING_FORMS for s in ring_stages]
    return out


def _aot(name, S, fn, opts):
    common = {"cnt": "*i32", "bad": "*i32", "layers": "i32", "NA": "i32", "NB": "i32", "gap_ns": "i64",
              "limit": "i32"}
    if name.startswith("gluon_ring"):
        forms = {c: opts[c] for c in ("PRUNE", "DEFER")}
        opts = {o: v for o, v in opts.items() if o not in forms}
        sig = {"w_desc": W_DESC_TYPE, "x_ptr": "*fp16", "out_ptr": "*fp32", **common, "S": "constexpr",
               "WARPS": "constexpr", **{c: "constexpr" for c in forms}}
        return compile_sm90(fn, sig, {"S": S, "WARPS": WARPS, **forms}, opts, True)
    forms = {c: opts[c] for c in ("PRUNE", "DEFER", "TABLE", "SLICES", "AHEAD") if c in opts}
    opts = {o: v for o, v in opts.items() if o not in forms}
    sig = {"w_ptr": "*fp16", "x_ptr": "*fp16", "out_ptr": "*fp32", "tab_ptr": "*i32", **common, "K": "constexpr",
           "R": "constexpr",
           **{c: "constexpr" for c in forms}}
    return compile_sm90(fn, sig, {"K": K, "R": R, **forms}, opts, False, {(i,): ALIGNED for i in range(3)})


def compile_only(stages):
    print(f"{'kernel':<22}{'S':>3}{'regs':>6}{'spill B':>9}{'shared B':>10}")
    for name, S, fn, opts in variants(stages):
        k = _aot(name, S, fn, opts)
        regs, spill = _usage(k)
        print(f"{name:<22}{S:>3}{regs!s:>6}{spill!s:>9}{k.metadata.shared:>10}")


# --------------------------------------------------------------------------- on the GPU
def run(args):
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    sms = props.multi_processor_count
    L, NA, NB = args.layers, args.phase_a, args.phase_b
    n_tiles = L * (NA + NB)
    n_rows = n_tiles * R
    torch.manual_seed(0)
    w = torch.randn(n_rows, K, device=dev, dtype=torch.float16)
    x = torch.randn(K, device=dev, dtype=torch.float16)
    ref = torch.cat([blk.float() @ x.float() for blk in w.split(1 << 16)])
    out = torch.empty(n_rows, device=dev, dtype=torch.float32)
    tab = torch.arange(n_tiles, device=dev, dtype=torch.int32)      # tile i's row says tile i
    cnt = torch.zeros(L * (3 + 16) * 32, device=dev, dtype=torch.int32)    # 3 a layer, then up to 16 slices
    bad = torch.zeros(1, device=dev, dtype=torch.int32)
    desc = TensorDescriptor(w.view(n_rows, C, B), [n_rows, C, B], [K, B, 1], [R, C, B], W_LAYOUT)
    layer_bytes = (NA + NB) * TILE_BYTES
    rows = []
    for gap_us in args.gaps:
        for name, S, fn, opts in variants(args.stages):
            if args.forms and name not in args.forms:
                continue
            ring = name.startswith("gluon_ring")
            for P in (args.ring_programs if ring else args.programs):
                common = (cnt, bad, L, NA, NB, int(gap_us * 1000), LIMIT)
                if ring:
                    launch = partial(fn[(P,)], desc, x, out, *common, S=S, WARPS=WARPS, **opts)
                else:
                    launch = partial(fn[(P,)], w, x, out, tab, *common, K=K, R=R, **opts)
                row = dict(variant=name, P=P, S=S, gap_us=gap_us, us_per_layer=None, ok=None, note="")
                rows.append(row)
                # every program must be resident at once (the waits would deadlock): judged before launching
                if ring and -(-P // sms) * (S * TILE_BYTES + 4096) > SMEM_PER_SM:
                    row["note"] = f"not co-resident: {-(-P // sms)} programs/SM of {S} x 32 KB stages"
                    continue

                def once():
                    cnt.zero_()
                    bad.zero_()
                    return launch()
                k = once()
                torch.cuda.synchronize()
                row["shared_bytes"] = k.metadata.shared
                if -(-P // sms) > SMEM_PER_SM // max(k.metadata.shared, 1):
                    row["note"] = f"not co-resident: {-(-P // sms)} programs/SM need {k.metadata.shared} B each"
                    continue
                out.fill_(float("nan"))
                once()
                torch.cuda.synchronize()
                err = ((out - ref).abs().max() / ref.abs().max()).item()
                # each task counted once: a count off would let a phase start before its producers
                counts = cnt[:L * 3 * 32].view(L, 3, 32)[:, :, 0].cpu()
                n_sl = opts.get("SLICES", 0)
                if n_sl > 0:
                    a_counts = cnt[L * 3 * 32:L * (3 + n_sl) * 32].view(L, n_sl, 32)[:, :, 0].sum(1).cpu()
                else:
                    a_counts = counts[:, PHASE_A.value]
                counted = bool((counts[:, GAP.value] == 1).all() and (a_counts == NA).all()
                               and (counts[:, PHASE_B.value] == NB).all())
                row.update(rel_err=err, gave_up=int(bad.item()), counts_ok=counted,
                           ok=bool(err <= 1e-3 and bad.item() == 0 and counted))
                if not row["ok"]:
                    row["note"] = f"wrong: max rel err {err:.3g}, {int(bad.item())} waits gave up, counts ok: {counted}"
                    continue
                row["us_per_layer"] = median_launch_us(launch, args.warmup, args.iters,
                                                       reset=lambda: (cnt.zero_(), bad.zero_())) / L
                row["weight_TBps"] = layer_bytes / (row["us_per_layer"] * 1e-6) / 1e12
                print(json.dumps(row), flush=True)
    print(f"{props.name}: {L} layers of {NA} + {NB} tiles ({layer_bytes / 1e6:.1f} MB a layer: "
          f"{layer_bytes / 4.2e12 * 1e6:.1f} us at 4.2 TB/s)")
    print(f"{'variant':<22}{'P':>5}{'S':>3}{'gap us':>8}{'us/layer':>10}{'TB/s':>7}  note")
    for r in rows:
        t = f"{r['us_per_layer']:.1f}" if r["us_per_layer"] else "-"
        bw = f"{r['weight_TBps']:.2f}" if r.get("weight_TBps") else "-"
        print(f"{r['variant']:<22}{r['P']:>5}{r['S']:>3}{r['gap_us']:>8}{t:>10}{bw:>7}  {r['note']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=props.name, sms=sms, layers=L, phase_a=NA, phase_b=NB, tile_bytes=TILE_BYTES,
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    ap.add_argument("--compile-only", action="store_true", help="compile every kernel for sm_90, no GPU")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--phase-a", type=int, default=2048, help="tiles of the first phase (Llama-3.2-1B's W1/W3)")
    ap.add_argument("--phase-b", type=int, default=1024, help="tiles of the second phase (its W2)")
    ap.add_argument("--gaps", type=float, nargs="+", default=[0.0, 10.0], help="idle gap before each layer, us")
    ap.add_argument("--programs", type=int, nargs="+", default=[132, 264, 396], help="the register form's grids")
    ap.add_argument("--ring-programs", type=int, nargs="+", default=[132, 264])
    ap.add_argument("--stages", type=int, nargs="*", default=[2, 3, 6], help="the ring's stages (none: no ring)")
    ap.add_argument("--forms", nargs="*", default=None, help="only these variants (default: all)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    compile_only(a.stages) if a.compile_only else run(a)

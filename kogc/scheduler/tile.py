"""Fused ops -> tasks: lay out buffers, cut each fused op into tiles sized for the target.

A matvec task is a block of whole weight rows (`rows x K`, about `tile_bytes`); attention is one
task per (lane, KV head, split of the positions), combined in the consumer's prologue; elementwise
work is one task per lane and block of rows.
"""
from __future__ import annotations

import dataclasses
import json
import math
import struct
from dataclasses import dataclass, field

from ..ir.graph import Graph, Op
from .errors import SchedulerError
from .fuse import ALL, ATTN_COMBINE, OTHERS, OWN, PLAIN, RESIDUAL, ROPE_CACHE, ROPE_STORE, STORE_ARGMAX, FusedOp, is_pow2
from .tasks import (A_CACHE, A_COL0, A_EPS, A_H, A_KEYS, A_OUT, A_OWN_COEF, A_RES_OUT, A_ROW0, A_SLOT, A_TERM,
                    A_TERM_COEF, A_TERM_SEL, A_TERM_STRIDE, A_X, A_X2, NARGS, SELECT_CODES, TOKEN_KEYS, Region,
                    Task, WeightTile)

ESIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def f32_bits(x: float) -> int:
    """A float as the int32 its bits spell, for the int table (the kernel bitcasts it back)."""
    return struct.unpack("<i", struct.pack("<f", float(x)))[0]


@dataclass
class Layout:
    """Where every stored value lives: name -> (arena, offset of lane 0, per-lane size, lanes)."""
    slots: dict[str, tuple[str, int, int, int]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=lambda: {"act": 0, "f32": 0, "kv": 0, "small": 0, "out": 1})

    def alloc(self, name: str, arena: str, per_lane: int, lanes: int) -> tuple[str, int, int, int]:
        if name not in self.slots:
            self.sizes.setdefault(arena, 0)        # "arrive": attention's arrival counters, only when used
            self.slots[name] = (arena, self.sizes[arena], per_lane, lanes)
            self.sizes[arena] += per_lane * max(lanes, 1)
            self.sizes[arena] += (-self.sizes[arena]) % 64       # keep every slot 128-byte aligned
        return self.slots[name]

    def at(self, name: str, lane: int, row: int = 0) -> int:
        arena, off, per_lane, lanes = self.slots[name]
        return off + (lane * per_lane if lanes and lane >= 0 else 0) + row

    def region(self, name: str, lane: int, start: int, end: int) -> Region:
        return Region(self.slots[name][0], self.at(name, lane, start), self.at(name, lane, end))


@dataclass
class TileConfig:
    tile_bytes: int = 32 * 1024       # weight bytes per matvec task
    attn_splits: int = 16             # splits of the positions 0..pos per (lane, KV head), each cdiv(pos+1, splits)
    attn_block: int = 0               # positions per inner step of attention; 0: 64 with dot, 16 with reduce
                                      # (the best measured of 16/32/64 for each, docs/performance-notes.md)
    attn_impl: str = "auto"           # "reduce" (broadcast products) | "dot" (tl.dot, query group padded to
                                      # 16) | "auto": dot where it applies (16-bit cache, head_dim >= 16, <= 16
                                      # query heads per KV head), else reduce
    attn_cost_scale: float = 1.0      # the cost model's attention bytes x this (measured slower per byte than a matvec)
    lane_stagger: float = 0.0         # placement: rank lane l's tasks l * this fused ops later (lanes out of phase)
    lane_group_stagger: float = 2.0   # placement: rank the upper half of the lanes this many fused ops later:
                                      # two lane groups out of phase, one streaming its MLP while the other
                                      # waits through attention (with the target's kind_us and a 1 us hop:
                                      # 1.529 -> 1.461 ms, -4.4%, on laneformer-2b at context 1024; 3 ops -3.7%)
    elem_block: int = 2048            # rows per elementwise task
    cost_context: int = 1024          # context length the cost model assumes for attention
    l2_prefetch: int = 0              # bytes of the program's weight stream a matvec asks L2 for ahead of
                                      # its own tile (0: off; needs a target with a prefetch instruction)
    wide_combine: bool = False        # Wo's combine of the attention splits loads the partials 128 bits at a
                                      # time (an alignment hint; 32-bit loads without: 124 of them in
                                      # laneformer-2b's Wo body against 22-31 in every other matvec).
                                      # Measured +3.5% (tenth session: 98 B of spills against 56)
    align_rows: bool = False          # pad each task-table row to whole 128-byte lines: a row of 22-24 ints
                                      # straddles two lines for about half the tasks, so the first wait's
                                      # event (near the row's end) can be a second L2 round trip after the
                                      # header's (the previous task's acquire emptied L1). Measured
                                      # neutral (ninth session: 1.467 against 1.463-1.469 ms)
    read_ahead: bool = False          # read the task table one task ahead: the next variant, number of
                                      # waits and first wait in registers (its acquire then needs no table
                                      # round trip first), the next row's lines asked of L2, a task's
                                      # arguments before its waits. Measured neutral (ninth session)
    argmax_atomic: bool = True        # the LM head's tasks fold their (max, row) into 64-bit keys by atomic
                                      # max, and the argmax task reads and clears them: one L2 round trip
                                      # instead of a loop over 16k partial maxima (8.7 -> 1.3-1.9 us)
    final_norm_2d: bool = True        # the final norm loads every lane's h as one [lanes, D] tile, twice
                                      # (sums of squares, then the normalised sum), the scales before its
                                      # wait: no load behind a reduction's barrier (still 8-9 us)
    greedy_kernel: bool = True        # a launch that cannot need top-k / top-p sampling (greedy, or plain
                                      # temperature) runs a kernel compiled without that code (FILTER=0);
                                      # the sampling code alone cost 144 B of spills in the whole kernel.
                                      # False: one kernel for every launch (the kernel before this option)
    final_norm_reload: str = "volatile"  # with final_norm_2d: how the second load of h avoids being merged
                                      # with the first: "volatile" (strong system-scope loads, which the
                                      # SASS issues one by one between the reductions) or "cg" (an L2-only
                                      # load: a different instruction, free to be scheduled early)
    final_norm_split: int = 1         # with final_norm_2d: the final norm as this many tasks, each summing
                                      # every lane's squares and writing D / this columns of x (the part
                                      # after the sums was 4.5-5.5 us of its 8-9). Built after the tenth
                                      # session's device time: not measured
    step_prefetch: int | None = None  # bytes of its weight stream each program asks L2 for at the end of a
                                      # step (the next step's first tiles, while the token is chosen, the
                                      # next launch starts and the embed runs, HBM is idle); 0: off; None:
                                      # 32 KB on a target with a prefetch instruction, else off. The three
                                      # together: -0.8% (tenth session; each alone within the noise)
    barrier_prefetch: int = 0         # bytes of each program's weight stream, from its first task that waits
                                      # on an all-lane residual (early comm: the first layer's barriers),
                                      # asked of L2 at the end of a step. In the first layer every lane
                                      # waits for all lanes' attention, and HBM idles for ~15 of the first
                                      # 30 us (tenth session's profile) while the MLP's weights wait
    arrival_prefetch: int = 0         # bytes of its weight stream (from the task's own tile) a program asks L2
                                      # for when it reaches its first task of a run that waits on an
                                      # all-lane task (a residual of the first layer, the final norm):
                                      # such a task waits long, behind every lane, while HBM has room
                                      # (the first layer; the last layer's tail and the final norm,
                                      # before the LM head). Such tasks are flagged in the task table
    kind_us: dict | None = None       # placement cost model: measured microseconds per task of each kind
                                      # (a profile's "matvec/rmsnorm/store": 2.7, ...); others: bytes.
                                      # None: the target's measured ones (Target.kind_us) with 32 KB
                                      # tiles; {}: the bytes model only
    place_latency_us: float = 1.0     # placement: publish-to-acquire latency between producer and consumer
    parallel_waits: bool = False      # a task with several waits issues all its acquire loads at once (one
                                      # round trip, not one per event); tensor atomics: refused on MI300X
    attn_pv: str = "fp16"             # with dot attention, probabilities x V: "fp16" (p rounded to a 16-bit
                                      # cache's dtype, one mma, as FlashAttention does; measured -8% at context
                                      # 1024, -17% at 4096), "ieee" (fp32 FMA, exact products), "tf32x3"
    merge_events: bool = True         # one counter for events the same tasks always wait on together (a lane's
                                      # Q/K/V for attention, W1/W3 for W2): one acquire instead of 2-3 (-2%)
    dynamic: bool = False             # one task list in the placement's order; each program takes the next
                                      # task by an atomic ticket (balances itself to the real task times)
    attn_preload: bool = False        # attention loads its first block of cache rows (earlier steps')
                                      # before its wait: only this step's row waits for the QKV task
    hoist_operands: bool = True       # a matvec loads its constants (table row, norm scale, cos/sin) before
                                      # its wait and its residual operands beside its input, not after its
                                      # own store: fewer L2 round trips in a row after the wait
    attn_last_combines: bool = False  # the last attention split of a (lane, KV head) to finish (an arrival
                                      # counter) combines all splits into o; Wo reads o plainly instead of
                                      # every Wo task combining the partials again
    attn_pipeline: bool = False       # attention loads block i+1 of the cache while it computes block i (one
                                      # round trip per split instead of one per block; twice the tiles held)
    attn_prefetch: bool = False       # attention asks L2 for its split's first block of cache rows before
                                      # its wait (no registers held, unlike attn_preload)
    cache_hints: bool = True          # L2 eviction hints: the weight stream evict_first (read once per step),
                                      # the task table evict_last (re-read every step: kept in L2 instead
                                      # of an HBM miss before every task's first wait). Measured -3.1%,
                                      # same bits (docs/performance-notes.md)
    kv_evict_first: bool = True       # attention's cache reads evict_first too (read once per step like the
                                      # weights; at long contexts they would push the table out of L2).
                                      # Measured -1% at context 1024, -3% at 4096
    header_ahead: bool = True         # fewer table round trips in a row per task: the publish's event id
                                      # is read with the variant and lane (not between the body's last
                                      # store and the release fence, after the acquire emptied L1), and
                                      # the first wait's event and count with the number of waits.
                                      # Measured -1%; with kv_evict_first -2.2% / -3.7% (1024 / 4096)
    ll_act: bool = False              # activations as NCCL's LL protocol: each 8-byte word holds 4 bytes of
                                      # data and the step's epoch; a reader polls the data itself (one L2
                                      # round trip per hop, no counter) and a producer read only that way
                                      # publishes nothing (no fence). Twice the activation bytes. Measured
                                      # +45% step time at 2b (docs/performance-notes.md): opt-in only


def tile_config_from_json(text: str) -> TileConfig:
    """TileConfig fields as a JSON object (what --tile-config takes) -> a TileConfig; a clear error for
    bad JSON, something else than an object, or unknown fields."""
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as e:
        raise SchedulerError(f"tile config is not JSON ({e.msg} at character {e.pos}): {text!r}") from None
    if not isinstance(fields, dict):
        raise SchedulerError(f"tile config must be a JSON object of TileConfig fields, got {text!r}")
    known = {f.name for f in dataclasses.fields(TileConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise SchedulerError(f"tile config: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return dataclasses.replace(TileConfig(), **fields)


def tile(graph: Graph, ops: list[FusedOp], cfg: TileConfig) -> tuple[list[Task], Layout]:
    by = graph.by_name()
    es = ESIZE[graph.weight_dtype]
    lay = Layout()
    tasks: list[Task] = []

    def new(variant, op, lane, args, reads, writes, weight=None, cost=0):
        tasks.append(Task(len(tasks), variant, op.node, lane, op.layer, args, reads, writes, weight, cost))

    def val(name):  # allocate a stored activation
        t = by[name].type
        return lay.alloc(name, "act", math.prod(t.shape), t.lanes)

    for n in graph.nodes:
        if n.op is Op.STATE:
            lay.alloc(n.name, "kv", math.prod(n.type.shape), n.type.lanes)
        elif n.op is Op.PARAM and len(n.type.shape) == 1:
            lay.alloc(n.name, "small", n.type.shape[0], n.type.lanes)
    lanes_of = lambda op: range(op.lanes) if op.lanes else [-1]  # noqa: E731

    for op in ops:
        p = op.p
        if op.kind == "embed":
            d = by[p["out"]].type.shape[0]
            _pow2(d, "hidden size", op)
            val(p["out"])
            for l in lanes_of(op):
                args = _args({A_OUT: lay.at(p["out"], l)})
                new(("embed", d), op, l, args, [], [lay.region(p["out"], l, 0, d)], cost=d * es)
        elif op.kind == "matvec":
            _tile_matvec(op, by, lay, val, new, cfg, es, lanes_of)
        elif op.kind == "attention":
            _tile_attention(op, by, lay, val, new, cfg, es, lanes_of)
        elif op.kind == "residual":
            d = by[p["out"]].type.shape[0]
            val(p["out"])
            blk = min(d, cfg.elem_block)
            _pow2(blk, "residual block", op)
            (term,) = p["terms"] if len(p["terms"]) == 1 else _too_many(op)
            L = op.lanes
            for l in lanes_of(op):
                for r0 in range(0, d, blk):
                    args = _args({A_H: lay.at(p["h"], l, r0), A_OUT: lay.at(p["out"], l, r0)})
                    reads = [lay.region(p["h"], l, r0, r0 + blk)] + _term_reads(term, l, L, lay, r0, blk)
                    args = _term_args(args, term, l, lay, r0)
                    new(("residual", blk, L), op, l, args, reads, [lay.region(p["out"], l, r0, r0 + blk)],
                        cost=blk * es * (L + 2))
        elif op.kind == "final_norm":
            h, g = by[p["h"]], by[p["g"]]
            d, L = h.type.shape[0], h.type.lanes
            _pow2(d, "hidden size", op)
            val(p["out"])
            parts = _final_norm_parts(cfg, d, op)
            cols = d // parts
            for c0 in range(0, d, cols):
                args = _args({A_H: lay.at(p["h"], 0), A_TERM_STRIDE: d, A_X2: lay.at(p["g"], 0),
                              A_ROW0: d if g.type.lanes else 0, A_OUT: lay.at(p["out"], -1, c0), A_COL0: c0,
                              A_EPS: f32_bits(p["eps"])})
                reads = [lay.region(p["h"], l, 0, d) for l in range(L)]    # every column: the norms' sums
                # (the variant says whether each lane has its own scale, a shared one held as one row,
                # and how many columns of x a task writes)
                new(("final_norm", d, L, L if g.type.lanes else 1, cols), op, -1, args, reads,
                    [lay.region(p["out"], -1, c0, c0 + cols)], cost=d * es * L + cols * es)
        elif op.kind == "argmax":
            part = lay.slots[f"{p['logits']}.argmax"]
            nparts = part[2] // 2
            blk = min(2048, next_pow2(nparts))     # a running best per element: 2 x 16 values per thread
            logits = by[p["logits"]].type.shape[0]
            args = _args({A_X: part[1], A_ROW0: nparts, A_X2: lay.at(p["logits"], -1), A_H: logits,
                          A_KEYS: lay.at(f"{p['logits']}.keys", -1)})
            reads = [Region("f32", part[1], part[1] + 2 * nparts), lay.region(p["logits"], -1, 0, logits)]
            new(("argmax", blk), op, -1, args, reads, [Region("out", 0, 1)], cost=nparts * 8)
        else:
            raise SchedulerError(f"no tiling for fused op {op.kind}")
    return tasks, lay


def _final_norm_parts(cfg, d: int, op) -> int:
    """Tasks the final norm is split into (TileConfig.final_norm_split), checked."""
    if cfg.final_norm_reload not in ("volatile", "cg"):
        raise SchedulerError(f"final_norm_reload must be 'volatile' or 'cg'; got {cfg.final_norm_reload!r}")
    parts = cfg.final_norm_split
    if parts == 1:
        return 1
    if not cfg.final_norm_2d or cfg.ll_act:
        raise SchedulerError("final_norm_split needs final_norm_2d (and not ll_act): only that body writes a part of x")
    if parts < 1 or not is_pow2(parts) or d // parts < 16:
        raise SchedulerError(f"final_norm_split must be a power of two leaving >= 16 columns a task; got {parts} "
                             f"for hidden size {d} ({op.node})")
    return parts


def _tile_matvec(op, by, lay, val, new, cfg, es, lanes_of):
    p = op.p
    N, K = p["n"], p["k"]
    epi, pro = p["epilogue"], _prologue_kind(p, cfg)
    if pro in ("rmsnorm", ATTN_COMBINE):      # these prologues reduce over K whole (norm, heads)
        _pow2(K, "matvec input size", op)
    rows = _rows(N, K, es, cfg.tile_bytes, p)
    if p["out"]:
        val(p["out"])
    if epi == RESIDUAL:
        val(p["res_out"])
    if epi == STORE_ARGMAX:
        lay.alloc(f"{op.node}.argmax", "f32", 2 * (N // rows), 0)
        lay.alloc(f"{op.node}.keys", "f32", 2 * TOKEN_KEYS, 0)     # int64 each (argmax_atomic)
    L = max(op.lanes, 1)
    hd = p.get("head_dim", 0)
    combine = by[p["x"]] if pro == ATTN_COMBINE else None
    if combine is not None:
        hd = by[combine.inputs[1]].type.shape[2]
        nq = combine.type.shape[0] // hd
        variant_extra = (cfg.attn_splits, nq)
    else:
        variant_extra = (0, 0)
    terms = p.get("terms", [])
    if len(terms) > 1:
        _too_many(op)
    term = terms[0] if terms else None
    variant = ("matvec", rows, K, pro, epi, hd) + variant_extra + (op.lanes,)
    if not is_pow2(K):      # Triton's ranges are powers of two: K is held in KP lanes, the rest masked
        variant += (next_pow2(K),)
    wname = by[p["w"]].attrs["name"]
    for l in lanes_of(op):
        x_reads, x_args = _prologue(op, by, lay, l, K, cfg)
        for r0 in range(0, N, rows):
            a = _args(x_args)
            a[A_ROW0] = r0
            reads, writes = list(x_reads), []
            if p["out"]:
                a[A_OUT] = lay.at(p["out"], l, r0)
                writes.append(lay.region(p["out"], l, r0, r0 + rows))
            if epi in (ROPE_CACHE, "cache"):
                cache = by[p["cache"]]
                kvh, S, chd = cache.type.shape
                a[A_CACHE] = lay.at(p["cache"], l) + (r0 // chd) * S * chd + r0 % chd
                head = lay.at(p["cache"], l) + (r0 // chd) * S * chd
                writes.append(Region("kv", head, head + S * chd))
            if epi == RESIDUAL:
                a[A_H], a[A_RES_OUT] = lay.at(p["h"], l, r0), lay.at(p["res_out"], l, r0)
                a[A_OWN_COEF] = f32_bits(p["own_coef"])
                reads.append(lay.region(p["h"], l, r0, r0 + rows))
                writes.append(lay.region(p["res_out"], l, r0, r0 + rows))
                if term is not None:
                    reads += _term_reads(term, l, L, lay, r0, rows)
                    a = _term_args(a, term, l, lay, r0)
            if epi == STORE_ARGMAX:
                base, nparts, t = lay.slots[f"{op.node}.argmax"][1], N // rows, r0 // rows
                a[A_SLOT], a[A_TERM_STRIDE] = base + t, nparts
                a[A_KEYS] = lay.at(f"{op.node}.keys", -1)
                writes += [Region("f32", base + t, base + t + 1), Region("f32", base + nparts + t, base + nparts + t + 1)]
            w = WeightTile(wname, l if by[p["w"]].type.lanes else -1, r0, rows, K)
            new(variant, op, l, a, reads, writes, w, cost=rows * K * es + K * es)


def _prologue_kind(p, cfg) -> str:
    """The prologue a matvec runs: the fused op's, except that with attn_last_combines the attention
    output arrives combined (o in the activation arena), so Wo reads it like any vector."""
    return PLAIN if p["prologue"] == ATTN_COMBINE and cfg.attn_last_combines else p["prologue"]


def _prologue(op, by, lay, l, K, cfg):
    p = op.p
    pro = _prologue_kind(p, cfg)
    if pro == "rmsnorm":
        return [lay.region(p["x"], l, 0, K)], {A_X: lay.at(p["x"], l), A_X2: lay.at(p["g"], l),
                                                A_EPS: f32_bits(p["eps"])}
    if pro == "silu_mul":
        return [lay.region(p["x"], l, 0, K), lay.region(p["x2"], l, 0, K)], {A_X: lay.at(p["x"], l),
                                                                             A_X2: lay.at(p["x2"], l)}
    if pro == ATTN_COMBINE:
        arena, off, per_lane, lanes = lay.slots[f"{p['x']}.partials"]
        base = off + l * per_lane
        return [Region("f32", base, base + per_lane)], {A_X: base}
    return [lay.region(p["x"], l, 0, K)], {A_X: lay.at(p["x"], l)}


def _tile_attention(op, by, lay, val, new, cfg, es, lanes_of):
    p = op.p
    kv, g, hd, S = p["kv_heads"], p["group"], p["head_dim"], p["max_pos"]
    nq = kv * g
    K = nq * hd
    for what, x in (("query heads per KV head", g), ("head_dim", hd), ("query heads per lane", nq),
                    ("attention splits", cfg.attn_splits)):
        _pow2(x, what, op)
    impl, block = attention_impl(cfg, g, hd, es)
    if cfg.attn_pv not in ("ieee", "tf32x3", "fp16"):
        raise SchedulerError(f"unknown attn_pv {cfg.attn_pv!r} (ieee | tf32x3 | fp16)")
    # "dot-<pv>"; "fp16" rounds p to the cache's 16-bit dtype: with a 32-bit cache, P.V stays exact (ieee)
    pv = "ieee" if cfg.attn_pv == "fp16" and es != 2 else cfg.attn_pv
    kernel_impl = f"dot-{pv}" if pv != "ieee" and impl == "dot" else impl
    if impl == "dot" and (g > 16 or hd < 16 or block < 16):
        raise SchedulerError(f"attention with tl.dot needs <= 16 query heads per KV head, head_dim >= 16 and "
                             f"blocks of >= 16 positions (got {g}, {hd}, {block}) at {op.node}")
    ns = cfg.attn_splits
    per_lane = ns * K + 2 * ns * nq
    lay.alloc(f"{op.node}.partials", "f32", per_lane, op.lanes)
    if cfg.attn_last_combines:
        # o itself, written by whichever split arrives last (so every split declares the write: the
        # consumer waits for all of them); the arrival counters are internal to the attention tasks
        val(op.node)
        lay.alloc(f"{op.node}.arrive", "arrive", kv, op.lanes)
    ctx = min(cfg.cost_context, S)
    for l in lanes_of(op):
        pbase = lay.slots[f"{op.node}.partials"][1] + max(l, 0) * per_lane
        for kh in range(kv):
            kbase = lay.at(p["k_cache"], l) + kh * S * hd
            vbase = lay.at(p["v_cache"], l) + kh * S * hd
            for j in range(ns):
                a = _args({A_X: lay.at(p["q"], l, kh * g * hd), A_X2: kbase, A_CACHE: vbase, A_OUT: pbase,
                           A_ROW0: j, A_SLOT: kh})
                if cfg.attn_last_combines:
                    a[A_H] = lay.at(f"{op.node}.arrive", l, kh)
                    a[A_RES_OUT] = lay.at(op.node, l, kh * g * hd)
                reads = [lay.region(p["q"], l, kh * g * hd, (kh + 1) * g * hd),
                         Region("kv", kbase, kbase + S * hd), Region("kv", vbase, vbase + S * hd)]
                acc0 = pbase + j * K + kh * g * hd
                m0 = pbase + ns * K + j * nq + kh * g
                writes = [Region("f32", acc0, acc0 + g * hd), Region("f32", m0, m0 + g),
                          Region("f32", m0 + ns * nq, m0 + ns * nq + g)]
                if cfg.attn_last_combines:
                    writes.append(lay.region(op.node, l, kh * g * hd, (kh + 1) * g * hd))
                new(("attention", g, hd, ns, nq, block, kernel_impl), op, l, a, reads, writes,
                    cost=int(2 * (ctx // ns) * hd * es * cfg.attn_cost_scale))


def attention_impl(cfg: TileConfig, group: int, head_dim: int, esize: int) -> tuple[str, int]:
    """(implementation, positions per block) for attention: the config's, or for "auto" tl.dot where
    it applies (16-bit cache, head_dim >= 16, <= 16 query heads per KV head) and the broadcast-product
    reduction elsewhere; block 0 is 64 for dot and 16 for reduce."""
    impl = cfg.attn_impl
    if impl not in ("auto", "reduce", "dot"):
        raise SchedulerError(f"unknown attention implementation {impl!r} (auto | reduce | dot)")
    if impl == "auto":
        impl = "dot" if esize == 2 and head_dim >= 16 and group <= 16 else "reduce"
    return impl, cfg.attn_block or (64 if impl == "dot" else 16)


def _term_reads(term, l, L, lay, r0, rows):
    lanes = {OWN: [l], OTHERS: [j for j in range(L) if j != l], ALL: list(range(L))}[term.select]
    return [lay.region(term.value, j, r0, r0 + rows) for j in lanes]


def _term_args(a, term, l, lay, r0):
    a = list(a)
    a[A_TERM] = lay.at(term.value, l if term.select == OWN else 0, r0)
    a[A_TERM_STRIDE] = lay.slots[term.value][2]
    a[A_TERM_SEL] = SELECT_CODES[term.select]
    a[A_TERM_COEF] = f32_bits(term.coef)
    return a


def _args(d: dict) -> list[int]:
    a = [0] * NARGS
    for k, v in d.items():
        a[k] = int(v)
    return a


def _rows(N, K, es, tile_bytes, p) -> int:
    rows = 1
    while rows * 2 * K * es <= tile_bytes and N % (rows * 2) == 0:
        rows *= 2
    if p["epilogue"] in (ROPE_STORE, ROPE_CACHE, "cache"):
        rows = max(2 if p["epilogue"] != "cache" else 1, min(rows, p["head_dim"]))
        if N % rows or p["head_dim"] % rows:
            raise SchedulerError(f"cannot tile {N} rows with head_dim {p['head_dim']}")
    return rows


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _pow2(x: int, what: str, op: FusedOp):
    if not is_pow2(x):
        raise SchedulerError(f"{what} {x} at {op.node} ({op.source}) is not a power of two: not supported yet")


def _too_many(op: FusedOp):
    raise SchedulerError(f"residual at {op.node} ({op.source}) has more than one extra term: not supported yet")

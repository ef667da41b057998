"""Fused ops -> tasks: lay out buffers, cut each fused op into tiles sized for the target.

A matvec task is a block of whole weight rows (`rows x K`, about `tile_bytes`); attention is one
task per (lane, KV head, split of the positions), combined in the consumer's prologue; elementwise
work is one task per lane and block of rows.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from ..ir.executor import alibi_table_offsets, rope_table_offsets
from ..ir.graph import Graph, Op
from ..ir.shard import vocab_shard
from .config import ESIZE, TileConfig, attention_splits, last_split_combines, tile_rows, with_placement
from .errors import SchedulerError
from .fuse import (ALL, ATTN_COMBINE, GATED_KINDS, LAYERNORM, OTHERS, OWN, PLAIN, RESIDUAL, RMSNORM, ROPE_CACHE, ROPE_STORE,
                   STORE_ARGMAX, FusedOp, is_pow2, norm_constant)
from .tasks import (A_ALIBI, A_ALIBI_AT, A_BIAS, A_CACHE, A_COUNTS, A_EPS, A_H, A_HIST, A_KEYS, A_NORM_BIAS, A_OUT,
                    A_OWN_COEF, A_RECV, A_RECV_STRIDE, A_RES_OUT, A_ROPE, A_ROW0, A_SLOT, A_TERM, A_TERM_COEF,
                    A_TERM_SEL, A_TERM_STRIDE, A_WINDOW, A_X, A_X2, A_XIELU, HIST_WORDS, NARGS, SELECT_CODES, TOKEN_KEYS,
                    Exchange, Region, Task, WeightTile, next_pow2)

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


def tile(graph: Graph, ops: list[FusedOp], cfg: TileConfig) -> tuple[list[Task], Layout]:
    tasks, lay, _ = tile_rank(graph, ops, cfg)
    return tasks, lay


def tile_rank(graph: Graph, ops: list[FusedOp], cfg: TileConfig) -> tuple[list[Task], Layout, list[Exchange]]:
    """`tile`, and for one rank of several (graph.meta["ranks"] > 1, kogc.ir.shard) the sums it
    receives from its peers: a residual's term over other or all lanes, the final norm's lane sum and
    the token's key. A sender is a task of this rank too (every rank runs the same tasks)."""
    # attn_splits 0: chosen for the model (the same on every rank); placement settings left unset: the defaults
    cfg = with_placement(attention_splits(cfg, graph))
    by = graph.by_name()
    es = ESIZE[graph.weight_dtype]
    lay = Layout()
    tasks: list[Task] = []
    npeer = graph.meta.get("ranks", 1) - 1
    exchanges: list[Exchange] = []
    # the matvec outputs a residual term sums over other or all lanes: each rank sends its lanes' sum
    sent = {t.value for op in ops for t in op.p.get("terms", []) if t.select in (OTHERS, ALL)} if npeer else set()

    def new(variant, op, lane, args, reads, writes, weight=None, cost=0):
        tasks.append(Task(len(tasks), variant, op.node, lane, op.layer, args, reads, writes, weight, cost))

    def recv_slot(value, n, op, extra=0) -> Exchange:
        """The exchange of `value`, its receive buffer ([2][npeer][n] fp32, then `extra` more) made once."""
        name = f"{value}.recv"
        if name not in lay.slots:
            lay.alloc(name, "f32", 2 * npeer * n + extra, 0)
            exchanges.append(Exchange(value, name, n))
        return next(x for x in exchanges if x.recv == name)

    def send(value, op):
        """The tasks that sum `value` over this rank's lanes and store it into every peer's buffer, in blocks
        of elements as a residual's (`elem_block`): the blocks' stores and fences run on several programs."""
        t = by[value].type
        d = t.shape[0]
        blk = _pow2_block(d, cfg.elem_block)
        x = recv_slot(value, d, op)
        sop = FusedOp("send", f"{value}.send", 0, {}, op.source, op.layer)
        for r0 in range(0, d, blk):
            args = _args({A_X: lay.at(value, 0, r0), A_TERM_STRIDE: lay.slots[value][2],
                          A_RECV: lay.at(x.recv, -1, r0)})
            new(("send", blk, t.lanes, d), sop, -1, args, [lay.region(value, l, r0, r0 + blk) for l in range(t.lanes)],
                [], cost=blk * es * t.lanes + 4 * blk * npeer)
            x.sends.append(tasks[-1].id)

    def val(name):  # allocate a stored activation
        t = by[name].type
        return lay.alloc(name, "act", math.prod(t.shape), t.lanes)

    for n in graph.nodes:
        if n.op is Op.STATE:
            lay.alloc(n.name, "kv", math.prod(n.type.shape), n.type.lanes)
        elif n.op is Op.PARAM and len(n.type.shape) == 1:
            lay.alloc(n.name, "small", n.type.shape[0], n.type.lanes)
    for op in ops:      # a LayerNorm's missing weight or bias: a shared constant vector (filled when packed)
        for c in (op.p.get(k) for k in ("g", "b")):
            if c and norm_constant(c) is not None:
                lay.alloc(c, "small", int(c.split(".")[1]), 0)
    lanes_of_value = lambda v: 0 if norm_constant(v) is not None else by[v].type.lanes     # noqa: E731
    lanes_of = lambda op: range(op.lanes) if op.lanes else [-1]  # noqa: E731
    positions = next((op.p["max_pos"] for op in ops if op.kind == "attention"), 0)
    rope_at = rope_table_offsets(graph, positions)
    alibi_at = alibi_table_offsets(graph, positions)

    for op in ops:
        p = op.p
        if op.kind == "embed":
            d = by[p["out"]].type.shape[0]
            val(p["out"])
            # a learned position embedding: its table's rows follow the token table's in EMB, from row A_X on
            pos_rows = by[p["table"]].type.shape[0] if p["pos_table"] else 0
            for l in lanes_of(op):
                args = _args({A_OUT: lay.at(p["out"], l), A_X: pos_rows})
                if p.get("g"):      # normed in the task (BLOOM's embedding LayerNorm, NanoChat's RMSNorm)
                    args[A_X2], args[A_EPS] = lay.at(p["g"], 0), f32_bits(p["eps"])
                    if p["b"]:
                        args[A_NORM_BIAS] = lay.at(p["b"], 0)
                norm = {LAYERNORM: ("ln",), RMSNORM: ("rms",)}.get(p.get("norm"), ())
                new(("embed", d) + (("pos",) if pos_rows else ()) + norm, op, l, args, [],
                    [lay.region(p["out"], l, 0, d)], cost=d * es * (2 if pos_rows else 1))
        elif op.kind == "matvec":
            _tile_matvec(op, by, lay, val, new, cfg, es, lanes_of, sent, recv_slot, rope_at)
            if p["out"] in sent:
                send(p["out"], op)
        elif op.kind == "attention":
            _tile_attention(op, by, lay, val, new, cfg, es, lanes_of, alibi_at.get(op.node))
        elif op.kind == "head_norm":
            # every head of one lane's q or k: the norm per head (or over them all), its scale, RoPE; into the activations or,
            # at the position, the KV cache
            nh, hd = p["heads"], p["head_dim"]
            _pow2(hd, "head_dim (with a norm per head)", op)
            if p["out"]:
                val(p["out"])
            for l in lanes_of(op):
                args = _args({A_X: lay.at(p["x"], l), A_X2: lay.at(p["g"], l), A_EPS: f32_bits(p["eps"]),
                              A_ROPE: rope_at[op.node]})
                if p["out"]:
                    args[A_OUT] = lay.at(p["out"], l)
                    writes, S = [lay.region(p["out"], l, 0, nh * hd)], 0
                else:
                    kvh, S, _ = by[p["cache"]].type.shape
                    args[A_CACHE] = lay.at(p["cache"], l)
                    writes = [Region("kv", args[A_CACHE], args[A_CACHE] + kvh * S * hd)]
                new(("head_norm", nh, hd, S, int(p["whole"]), int(p["rope_first"])), op, l, args, [lay.region(p["x"], l, 0, nh * hd)], writes,
                    cost=2 * nh * hd * es)
        elif op.kind == "residual":
            d = by[p["out"]].type.shape[0]
            val(p["out"])
            blk = _pow2_block(d, cfg.elem_block)
            first, term = _residual_task_terms(op)
            L = op.lanes
            variant = ("residual", blk, L) + (("two",) if first else ())
            for l in lanes_of(op):
                for r0 in range(0, d, blk):
                    args = _args({A_H: lay.at(p["h"], l, r0), A_OUT: lay.at(p["out"], l, r0)})
                    reads = [lay.region(p["h"], l, r0, r0 + blk)] + _term_reads(term, l, L, lay, r0, blk)
                    if first:
                        args[A_X], args[A_OWN_COEF] = lay.at(first.value, l, r0), f32_bits(first.coef)
                        reads += _term_reads(first, l, L, lay, r0, blk)
                    args = _term_args(args, term, l, lay, r0)
                    if term.value in sent and term.select != OWN:
                        reads.append(_remote_term(args, term, by, lay, recv_slot(term.value, d, op).recv, r0))
                    new(variant, op, l, args, reads, [lay.region(p["out"], l, r0, r0 + blk)],
                        cost=blk * es * (L + 2 + bool(first)))
        elif op.kind == "normed_residual":
            # each block reads the whole of x for its sum of squares, so it waits for every task storing x
            d = by[p["out"]].type.shape[0]
            val(p["out"])
            blk = _pow2_block(d, cfg.elem_block)
            for l in lanes_of(op):
                for r0 in range(0, d, blk):
                    args = _args({A_H: lay.at(p["h"], l, r0), A_OUT: lay.at(p["out"], l, r0), A_X: lay.at(p["x"], l),
                                  A_X2: lay.at(p["g"], l), A_ROW0: r0, A_EPS: f32_bits(p["eps"])})
                    reads = [lay.region(p["h"], l, r0, r0 + blk), lay.region(p["x"], l, 0, d)]
                    new(("normed_residual", blk, d), op, l, args, reads, [lay.region(p["out"], l, r0, r0 + blk)],
                        cost=(d + 3 * blk) * es)
        elif op.kind == "final_norm":
            h = by[p["h"]]
            d, L, g_lanes = h.type.shape[0], h.type.lanes, lanes_of_value(p["g"])
            val(p["out"])
            args = _args({A_H: lay.at(p["h"], 0), A_TERM_STRIDE: d, A_X2: lay.at(p["g"], 0),
                          A_ROW0: d if g_lanes else 0, A_OUT: lay.at(p["out"], -1), A_EPS: f32_bits(p["eps"])})
            if p["norm"] == LAYERNORM:
                if lanes_of_value(p["b"]) != g_lanes:
                    raise SchedulerError(f"a LayerNorm's weight and bias must both be shared or both per lane, at "
                                         f"{op.source or '?'}")
                args[A_NORM_BIAS] = lay.at(p["b"], 0)
            reads = [lay.region(p["h"], l, 0, d) for l in range(L)]
            # (the variant says whether each lane has its own scale or all share one, held as one row)
            variant = ("final_norm", d, L, L if g_lanes else 1, p["norm"])
            if not npeer:
                new(variant, op, -1, args, reads, [lay.region(p["out"], -1, 0, d)], cost=d * es * (L + 1))
            else:
                # this rank's lanes' sum (fp32) kept here and stored into every peer's buffer; then the
                # mean over all lanes from it and the peers' sums (whole vectors of next_pow2(d), the rest 0)
                dp = next_pow2(d)
                part = f"{p['out']}.partial"
                lay.alloc(part, "f32", dp, 0)
                x = recv_slot(p["out"], dp, op)
                recv = x.recv
                args[A_OUT], args[A_RECV] = lay.at(part, -1), lay.at(recv, -1)
                new(variant + ("send",), op, -1, args, reads, [lay.region(part, -1, 0, dp)],
                    cost=d * es * L + 4 * d * (npeer + 1))
                x.sends.append(tasks[-1].id)
                cop = FusedOp("combine", f"{op.node}.combine", 0, {}, op.source, op.layer)
                args = _args({A_X: lay.at(part, -1), A_RECV: lay.at(recv, -1), A_OUT: lay.at(p["out"], -1)})
                new(("combine", d, by[p["h"]].type.lanes * (npeer + 1)), cop, -1, args,
                    [lay.region(part, -1, 0, dp), lay.region(recv, -1, 0, 2 * npeer * dp)],
                    [lay.region(p["out"], -1, 0, d)], cost=4 * d * (npeer + 1) + d * es)
        elif op.kind == "argmax":
            # the token from the LM head's keys; the logits (read by top-k / top-p sampling, in blocks)
            # make it wait for every LM head task
            logits = by[p["logits"]].type.shape[0]
            blk = min(2048, next_pow2(logits))
            args = _args({A_X2: lay.at(p["logits"], -1), A_H: logits, A_KEYS: lay.at(f"{p['logits']}.keys", -1),
                          A_HIST: lay.at(f"{p['logits']}.hist", -1)})
            if not npeer:
                new(("argmax", blk), op, -1, args, [lay.region(p["logits"], -1, 0, logits)], [Region("out", 0, 1)],
                    cost=TOKEN_KEYS * 8)
            else:
                # this rank's best key (of its vocabulary shard) to every peer, then the best of all. A
                # launch with top-k / top-p also copies the shard's logits (as stored: the model's type) into
                # every rank's whole logits, [2 step parities][V] after the keys in the receive buffer, for
                # the filter
                vocab = graph.meta.get("vocab", logits)
                own = f"{op.node}.key"
                lay.alloc(own, "f32", 2, 0)            # one int64 word
                words = -(-2 * vocab * es // 4)         # (the copy in the f32 arena's words)
                x = recv_slot(own, 2, op, extra=words)
                recv = x.recv
                whole = lay.at(recv, -1) + 4 * npeer
                kop = FusedOp("keysend", f"{op.node}.keysend", 0, {}, op.source, op.layer)
                kargs = _args({A_X: lay.at(f"{p['logits']}.keys", -1), A_OUT: lay.at(own, -1),
                               A_RECV: lay.at(recv, -1), A_X2: lay.at(p["logits"], -1), A_H: logits,
                               A_ROW0: graph.meta.get("vocab_row0", 0), A_TERM: whole, A_TERM_STRIDE: vocab})
                new(("keysend", min(KEYSEND_BLOCK, next_pow2(logits))), kop, -1, kargs,
                    [lay.region(p["logits"], -1, 0, logits)],
                    [lay.region(own, -1, 0, 2), Region("f32", whole, whole + words)],
                    cost=TOKEN_KEYS * 8 + 8 * npeer)
                x.sends.append(tasks[-1].id)
                # (the ranked argmax reads one key of its own at A_KEYS, its peers' at A_X, and with top-k /
                # top-p the whole logits at A_TERM, A_H of them)
                args[A_KEYS], args[A_X], args[A_H] = lay.at(own, -1), lay.at(recv, -1), vocab
                args[A_TERM], args[A_TERM_STRIDE] = whole, vocab
                _, roff, rsize, _ = lay.slots[recv]
                reads = [lay.region(own, -1, 0, 2), Region("f32", roff, roff + rsize)]
                if es == 2:     # 16-bit logits: the peers' shards counted per key for top-k / top-p, on several programs
                    row0 = graph.meta.get("vocab_row0", 0)
                    reads.append(_count_peer_shards(op, new, whole, vocab, (row0, row0 + logits), npeer + 1,
                                                    lay.at(f"{p['logits']}.hist", -1)))
                new(("argmax", next_pow2(min(2048, vocab)) if vocab < 2048 else 2048, "ranked"), op, -1, args,
                    reads, [Region("out", 0, 1)], cost=8 * (npeer + 1))
        else:
            raise SchedulerError(f"no tiling for fused op {op.kind}")
    missing = [x.value for x in exchanges if not x.sends]
    if missing:
        raise SchedulerError(f"no task sends {missing[0]} to this rank's peers")
    return tasks, lay, exchanges


def _remote_term(a, term, by, lay, recv, r0) -> Region:
    """A residual term's peers' sums: where they arrive (A_RECV, A_RECV_STRIDE) and the region read."""
    n = by[term.value].type.shape[0]
    a[A_RECV], a[A_RECV_STRIDE] = lay.at(recv, -1, r0), n
    _, off, size, _ = lay.slots[recv]
    return Region("f32", off, off + size)


def _tile_matvec(op, by, lay, val, new, cfg, es, lanes_of, sent=(), recv_slot=None, rope_at=None):
    p = op.p
    N, K = p["n"], p["k"]
    epi, pro = p["epilogue"], _prologue_kind(p, cfg)
    fp8 = cfg.weights == "fp8"
    wes = 1 if fp8 else es      # bytes per stored weight: an FP8 tile holds twice the rows of an fp16 one
    stacked = 2 if epi in GATED_KINDS else 1   # weight rows per output row (a gated pair: `rows` (gate, up) pairs)
    rows = _rows(N, K, wes, cfg.tile_bytes // stacked, p)
    if p["out"]:
        val(p["out"])
    if epi == RESIDUAL:
        val(p["res_out"])
    if epi == STORE_ARGMAX:
        lay.alloc(f"{op.node}.keys", "f32", 2 * TOKEN_KEYS, 0)     # int64 each
        # top-k / top-p's counts per 16-bit key, made by these tasks or by the argmax task, which clears them. Not
        # regions, as the keys are not: the argmax waits for every task here, the next step's come after its token
        lay.alloc(f"{op.node}.hist", "f32", 2 * HIST_WORDS, 0)     # (one per step parity)
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
    variant = ("matvec", rows * stacked, K, pro, epi, hd) + variant_extra + (op.lanes,)
    # (a K that is not a power of two is held in column parts: kogc.scheduler.tasks.column_parts)
    if p["bias"]:
        variant += ("bias",)
    wnode = by[p["w"]]
    wname = wnode.attrs["name"]
    up = by[p["w2"]].attrs["name"] if stacked == 2 else ""
    lane0, shard_row0 = wnode.attrs.get("lane0", 0), wnode.attrs.get("row0", 0)   # one rank's lanes or rows
    for l in lanes_of(op):
        x_reads, x_args = _prologue(op, by, lay, l, K, pro)
        for r0 in range(0, N, rows):
            a = _args(x_args)
            a[A_ROW0] = r0
            if p["bias"]:
                a[A_BIAS] = lay.at(p["bias"], l, r0)
            if epi in (ROPE_STORE, ROPE_CACHE):
                a[A_ROPE] = rope_at[p["rope"]]
            for i, v in zip(A_XIELU, p.get("xielu", ())):
                a[i] = f32_bits(v)
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
                    if term.value in sent and term.select != OWN:
                        reads.append(_remote_term(a, term, by, lay, recv_slot(term.value, N, op).recv, r0))
            if epi == STORE_ARGMAX:
                a[A_SLOT] = r0 // rows          # which of the TOKEN_KEYS keys it folds into: slot % TOKEN_KEYS
                a[A_KEYS] = lay.at(f"{op.node}.keys", -1)
                a[A_COUNTS] = lay.at(f"{op.node}.hist", -1)
                a[A_ROW0] = shard_row0 + r0     # token ids are the whole vocabulary's
            w = WeightTile(wname, l + lane0 if wnode.type.lanes else -1, shard_row0 + r0, rows * stacked, K, wes, fp8,
                           up)
            new(variant, op, l, a, reads, writes, w, cost=w.nbytes + K * es)


def _prologue_kind(p, cfg) -> str:
    """The prologue a matvec runs: the fused op's, except that where the last attention split combines
    (config.last_split_combines) the attention output arrives as o in the activations, a plain vector."""
    return PLAIN if p["prologue"] == ATTN_COMBINE and last_split_combines(cfg, p["k"]) else p["prologue"]


def _prologue(op, by, lay, l, K, pro):
    p = op.p
    if pro in (RMSNORM, LAYERNORM):
        args = {A_X: lay.at(p["x"], l), A_X2: lay.at(p["g"], l), A_EPS: f32_bits(p["eps"])}
        if pro == LAYERNORM:
            args[A_NORM_BIAS] = lay.at(p["b"], l)
        return [lay.region(p["x"], l, 0, K)], args
    if pro in GATED_KINDS:
        return [lay.region(p["x"], l, 0, K), lay.region(p["x2"], l, 0, K)], {A_X: lay.at(p["x"], l),
                                                                             A_X2: lay.at(p["x2"], l)}
    if pro == ATTN_COMBINE:
        arena, off, per_lane, lanes = lay.slots[f"{p['x']}.partials"]
        base = off + l * per_lane
        return [Region("f32", base, base + per_lane)], {A_X: base}
    return [lay.region(p["x"], l, 0, K)], {A_X: lay.at(p["x"], l)}


def _tile_attention(op, by, lay, val, new, cfg, es, lanes_of, alibi_at):
    """alibi_at: where the attention's ALiBi slopes are in COS (None: no ALiBi)."""
    p = op.p
    kv, g, hd, S = p["kv_heads"], p["group"], p["head_dim"], p["max_pos"]
    nq = kv * g
    K = nq * hd
    # (query heads per KV head and per lane need not be powers of two: they are masked rows; nor the head size,
    # held in the next power of two of lanes: Phi-2's 80 in 128)
    _pow2(cfg.attn_splits, "attention splits", op)
    last = last_split_combines(cfg, K)
    impl, block = attention_impl(cfg, g, hd, es, last)
    ns = cfg.attn_splits
    per_lane = ns * K + ns * nq     # each split's normalised output, then its log-sum-exps
    lay.alloc(f"{op.node}.partials", "f32", per_lane, op.lanes)
    if last:
        # o itself, written by whichever split of its KV head finishes last (so every split declares the
        # write: the consumer waits for all of them), and one arrival counter (int32) per KV head
        val(op.node)
        lay.alloc(f"{op.node}.arrivals", "f32", kv, op.lanes)
    ctx = min(cfg.cost_context, S, p.get("window") or S)
    for l in lanes_of(op):
        pbase = lay.slots[f"{op.node}.partials"][1] + max(l, 0) * per_lane
        for kh in range(kv):
            kbase = lay.at(p["k_cache"], l) + kh * S * hd
            vbase = lay.at(p["v_cache"], l) + kh * S * hd
            for j in range(ns):
                a = _args({A_X: lay.at(p["q"], l, kh * g * hd), A_X2: kbase, A_CACHE: vbase, A_OUT: pbase,
                           A_ROW0: j, A_SLOT: kh, A_WINDOW: p.get("window", 0)})
                if p.get("alibi"):
                    a[A_ALIBI], a[A_ALIBI_AT] = alibi_at, p["alibi"]["at"]
                reads = [lay.region(p["q"], l, kh * g * hd, (kh + 1) * g * hd),
                         Region("kv", kbase, kbase + S * hd), Region("kv", vbase, vbase + S * hd)]
                acc0 = pbase + j * K + kh * g * hd
                lse0 = pbase + ns * K + j * nq + kh * g
                writes = [Region("f32", acc0, acc0 + g * hd), Region("f32", lse0, lse0 + g)]
                if last:
                    a[A_H] = lay.at(f"{op.node}.arrivals", l, kh)
                    a[A_RES_OUT] = lay.at(op.node, l, kh * g * hd)
                    writes.append(lay.region(op.node, l, kh * g * hd, (kh + 1) * g * hd))
                alibi = () if not p.get("alibi") else ("alibi_rounded",) if p["alibi"].get("rounded") else ("alibi",)
                new(("attention", g, hd, ns, nq, block, impl) + (("last",) if last else ()) + alibi, op, l, a, reads, writes,
                    cost=2 * (ctx // ns) * hd * es)


COMBINE_LANES = 256     # the widest combine pass of the last split (Qwen2.5-0.5B's 7 heads of 64, 512 lanes, spilled)


def heads_per_combine(group: int, head_dim: int) -> int:
    """Query heads the last attention split of a KV head combines in one pass: as few passes as COMBINE_LANES
    lanes allow (a pass in the power of two at or above heads x head_dim lanes), the heads spread evenly over
    them, the last pass taking what is left (Qwen2.5-0.5B's 7 heads of 64: 4 then 3). A pass is one round trip
    for the splits' partials; head by head, Llama-3.2-1B's shapes spent about 4 us of each layer's chain there
    (in one pass: -2.6% a token; Qwen3-0.6B's shapes -5.7%, SmolLM2-135M's -1.8%)."""
    lanes = max(COMBINE_LANES, head_dim)
    widest = max(h for h in range(1, group + 1) if next_pow2(h * head_dim) <= lanes)
    return -(-group // -(-group // widest))


# tl.dot attention's block where the output projection combines the splits: K and V tiles of 8,192
# elements each, so head_dim 64 runs 128 positions a block (laneformer-0.5b -2.3% at contexts 1024 and
# 4096 against 64: at 1024 a split holds 65 positions, one block instead of two) and head_dim 128 runs 64.
# Where the last split combines (one-lane models), 64: a 128-position block there measured -0.5% at 1024
# and +1.2% at 4096 (Llama-3.2-1B's shapes; docs/design.md)
DOT_BLOCK_ELEMS = 8192
DOT_BLOCK_POSITIONS = 128
DOT_BLOCK_LAST_COMBINES = 64
# query heads per KV head that the tl.dot form takes (in 16 rows or the next power of two): the broadcast form's
# [rows, positions, head_dim] products over a larger group spill (Falcon-7B's 71 heads: 21 KB on sm_90)
DOT_GROUP = 128


def attention_impl(cfg: TileConfig, group: int, head_dim: int, esize: int, last_combines: bool) -> tuple[str, int]:
    """(implementation, positions per block) for attention. "dot": tl.dot with the query group padded to
    16 rows (or the next power of two), QK^T with fp32 accumulation and P rounded to the cache's 16-bit dtype
    for P.V (as FlashAttention does; measured -8% at context 1024, -17% at 4096 against fp32 P.V), wherever it
    applies: a 16-bit cache, head_dim >= 16, <= DOT_GROUP query heads per KV head, blocks of >= 16 positions.
    "reduce" (broadcast products in fp32, exact) elsewhere. Block 0: for dot, 16 KB of keys (8,192 elements:
    64 positions of head_dim 128, 128 of head_dim 64; at most 128 positions), or 64 positions at most where
    the last split combines (`last_combines`), over a group of more than 16 rows as many fewer positions as
    keep the scores' tile that size (at least 16: Falcon-7B's 71 query heads on one KV head, 128 rows, take 16);
    for reduce 16."""
    dot = esize == 2 and head_dim >= 16 and group <= DOT_GROUP and (cfg.attn_block == 0 or cfg.attn_block >= 16)
    impl = "dot" if dot else "reduce"
    most = DOT_BLOCK_LAST_COMBINES if last_combines else DOT_BLOCK_POSITIONS
    rows = max(16, next_pow2(group))
    return impl, cfg.attn_block or (max(16, min(most, DOT_BLOCK_ELEMS // head_dim) * 16 // rows) if dot else 16)


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
    rows = tile_rows(N, K, es, tile_bytes)
    if p["epilogue"] in (ROPE_STORE, ROPE_CACHE, "cache"):
        # (whole rows inside one head: a head of 80, Phi-2's, in tiles of 16 rows)
        rows = max(2 if p["epilogue"] != "cache" else 1, _pow2_block(p["head_dim"], min(rows, p["head_dim"])))
        if N % rows or p["head_dim"] % rows:
            raise SchedulerError(f"cannot tile {N} rows with head_dim {p['head_dim']}: the kernel needs heads of a "
                                 f"power of two (a tile of whole rows inside one head)")
    return rows


KEYSEND_BLOCK = 4096    # the keysend's block of its shard's logits copied to the peers (one program; 1,024 a block
                        # left it waiting for a load's L2 round trip 16 times for laneformer-2b at G = 8)
COUNT_CHUNK = 4096      # a peer's logits counted a task: about 28 tasks for laneformer-2b's peers' shards on 8 GPUs


def _count_peer_shards(op: FusedOp, new, whole: int, vocab: int, own: tuple[int, int], ranks: int,
                       hist: int) -> Region:
    """A rank's count tasks: its peers' logits, as they arrive in its whole logits (`whole`, [2 step parities]
    [vocab] 16-bit values from f32 word `whole` on), counted per 16-bit key into the argmax's counts in chunks of
    at most COUNT_CHUNK ids (`peer_chunks`), spread over programs (its own shard's its LM head counts). Each reads
    its chunk of both parities (so it waits for the peers' sends and for this rank's keysend, after this rank's
    previous token: the previous draw cleared the counts) and writes the counts; the argmax reads them (the region
    returned)."""
    cop = FusedOp("count", f"{op.node}.count", 0, {}, op.source, op.layer)
    counts = Region("f32", hist, hist + 2 * HIST_WORDS)
    for k, (c0, c1) in enumerate(peer_chunks(vocab, own, ranks)):
        args = _args({A_TERM: whole, A_TERM_STRIDE: vocab, A_X: c0, A_H: c1 - c0, A_HIST: hist, A_SLOT: k})
        new(("count", min(1024, next_pow2(COUNT_CHUNK))), cop, -1, args,
            [Region("f32", whole + (p * vocab + c0) // 2, whole + (p * vocab + c1 + 1) // 2) for p in (0, 1)], [counts],
            cost=4 * (c1 - c0))
    return counts


def peer_chunks(vocab: int, own: tuple[int, int], ranks: int) -> list[tuple[int, int]]:
    """The ids outside this rank's shard `own`, in chunks of at most COUNT_CHUNK, as many on every rank: the ranks
    must run the same tasks, and a shard in the middle cuts the ids around it into more chunks than one at an end
    (Qwen3's vocabulary of 151,936 over 4 ranks: 29 against 28). A rank with fewer has its widest chunks halved."""
    def chunks(lo: int, hi: int) -> list[tuple[int, int]]:
        return [(c, min(c + COUNT_CHUNK, end)) for start, end in ((0, lo), (hi, vocab))
                for c in range(start, end, COUNT_CHUNK)]
    spans = [vocab_shard(vocab, ranks, r) for r in range(ranks)]
    most = max(len(chunks(lo, lo + n)) for lo, n in spans)
    out = chunks(*own)
    while len(out) < most:
        i = max(range(len(out)), key=lambda j: out[j][1] - out[j][0])
        c0, c1 = out[i]
        out[i:i + 1] = [(c0, (c0 + c1) // 2), ((c0 + c1) // 2, c1)]
    return out


def _pow2_block(d: int, cap: int) -> int:
    """The largest power of two <= cap that divides d: blocks of a vector whose width need not be one."""
    blk = 1
    while blk * 2 <= cap and d % (blk * 2) == 0:
        blk *= 2
    return blk


def _pow2(x: int, what: str, op: FusedOp):
    if not is_pow2(x):
        raise SchedulerError(f"{what} {x} at {op.node} ({op.source}) is not a power of two: not supported yet")


def _residual_task_terms(op: FusedOp):
    """(first, term) of a residual task: its one term (first None), or two of which one is this lane's own
    (first)."""
    terms = op.p["terms"]
    if len(terms) == 1:
        return None, terms[0]
    own = [t for t in terms if t.select == OWN]
    if len(terms) != 2 or not own:
        _too_many(op)
    first = own[0]
    return first, next(t for t in terms if t is not first)


def _too_many(op: FusedOp):
    raise SchedulerError(f"residual at {op.node} ({op.source}) has more than one extra term: not supported yet")

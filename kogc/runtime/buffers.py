"""Device buffers of a compiled kernel: weights packed in schedule order, arenas, tables, counters."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..fp8 import FORMATS, Fp8Weight, quantize
from ..ir.executor import TORCH_DTYPES, rope_angles, rope_tables
from ..ir.graph import Op
from ..scheduler import Schedule
from ..scheduler.tasks import column_parts, row_groups, stream_layout
from ..scheduler.fuse import norm_constant


@dataclass
class Buffers:
    W: torch.Tensor       # all programs' weight streams, one after another
    WOFF: torch.Tensor    # int64 [programs + 1]: where each program's stream starts; the last: the end
    TABLE: torch.Tensor
    QLEN: torch.Tensor
    ACT: torch.Tensor
    F32: torch.Tensor
    KV: torch.Tensor
    SMALL: torch.Tensor
    EMB: torch.Tensor
    COS: torch.Tensor
    SIN: torch.Tensor
    CNT: torch.Tensor
    ERR: torch.Tensor
    OUT: torch.Tensor
    PROF: torch.Tensor    # int64 [programs, max queue length, 3 (9 with profile="detail")] timestamps
                          # with profiling, else [1]
    PEERS: torch.Tensor   # int64 [peers, 2]: each peer's F32 and CNT addresses (one rank of several), else [2]

    def kernel_args(self, out: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The kernel's tensor arguments; `out` replaces OUT (e.g. pinned host memory to stream tokens)."""
        return [self.W, self.WOFF, self.TABLE, self.QLEN, self.ACT, self.F32, self.KV, self.SMALL, self.EMB,
                self.COS, self.SIN, self.CNT, self.ERR, self.OUT if out is None else out, self.PROF, self.PEERS]

    def nbytes(self) -> dict[str, int]:
        return {k: v.numel() * v.element_size() for k, v in self.__dict__.items()}


def pack_weights(schedule: Schedule, weights: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One contiguous stream per program: its tasks' weight tiles in the order it runs them. FP8
    (TileConfig.weights): each tile's values, then its rows' fp32 scales (kogc.scheduler.tasks.stream_layout),
    quantized here from the model's weights, or taken as they are from pre-quantized ones (kogc.fp8.Fp8Weight).

    Built on the host and copied once, so the device holds only the packed copy. The tiles are formed a whole
    weight (one lane's) at a time, in the stream's order, then each copied to its place: one copy a tile
    rather than a slice, a reorder and a copy (laneformer-2b has 124k tiles)."""
    fp8 = schedule.tile_config.weights == "fp8"
    dtype = FORMATS[schedule.weight_format] if fp8 else TORCH_DTYPES[schedule.dtype]
    offsets = np.concatenate([[0], np.cumsum(schedule.weight_elems_per_program())]).astype(np.int64)
    stream = torch.zeros(int(offsets[-1]) + 16, dtype=torch.uint8 if fp8 else dtype)
    at_of, by_weight = {}, {}     # where each tile goes; the tiles of one weight of one lane, by shape
    for p, q in enumerate(schedule.queues):
        at = int(offsets[p])
        for tid in q:
            w = schedule.tasks[tid].weight
            if w is not None:
                at_of[tid] = at
                by_weight.setdefault((w.param, w.up, w.lane, w.rows, w.cols), []).append(tid)
                at += w.stream_elems
    host = {}
    for tids in by_weight.values():
        w = schedule.tasks[tids[0]].weight
        for name in filter(None, (w.param, w.up)):
            if name not in host:
                host[name] = _host_weight(weights[name], schedule) if fp8 else weights[name].detach().to("cpu", dtype)
        tiles = _tiles_of([host[w.param]] + ([host[w.up]] if w.up else []), w, schedule, fp8)
        per_source = w.rows // (2 if w.up else 1)
        for tid in tids:
            t = schedule.tasks[tid].weight
            stream[at_of[tid]:at_of[tid] + t.stream_elems] = tiles[t.row0 // per_source]
    if fp8:
        stream = stream.view(dtype)
    return stream.to(device), torch.tensor(offsets, dtype=torch.int64, device=device)


def _tiles_of(src: list, w, schedule: Schedule, fp8: bool) -> torch.Tensor:
    """Every tile of w's shape that w's weight (one lane's; a gated pair's two, rows alternating) cuts into,
    [tiles, stream elements], each as the stream holds it: its column parts one after the other
    (kogc.scheduler.tasks.column_parts), each with its rows in the kernel's order (order_rows), then for
    FP8 the rows' scales as bytes at the tile's scale offset. Tile k holds rows k r .. k r + r of each source
    (r: the tile's rows per source)."""
    r = w.rows // len(src)

    def blocks(ts):        # [tiles, rows, ...]: each source's lane cut into blocks of r rows, pairs alternating
        parts = [(t[w.lane] if w.lane >= 0 else t) for t in ts]
        parts = [t.reshape(t.shape[0] // r, r, *t.shape[1:]) for t in parts]
        return parts[0] if len(parts) == 1 else torch.stack(parts, 2).reshape(parts[0].shape[0], w.rows,
                                                                              *parts[0].shape[2:])
    values = blocks([s[0] for s in src] if fp8 else src)
    (k1, _), (k2, _) = column_parts(w.cols)
    parts = [values[..., :k1]] + ([values[..., k1:]] if k2 else [])
    values = torch.cat([order_rows(p, row_groups(w.rows, p.shape[-1], schedule.weight_esize, schedule.target),
                                   schedule.target).reshape(len(p), -1) for p in parts], 1)
    if not fp8:
        return values
    soff, length = stream_layout(w.rows, w.cols, 1, True)
    tiles = torch.zeros(values.shape[0], length, dtype=torch.uint8)
    tiles[:, :values.shape[1]] = values
    tiles[:, soff:soff + 4 * w.rows] = blocks([s[1] for s in src]).contiguous().view(torch.uint8)
    return tiles


def order_rows(values: torch.Tensor, groups: int, target) -> torch.Tensor:
    """A tile [rows, cols] (or tiles [..., rows, cols]) in the stream's order for `groups` row groups S
    (kogc.scheduler.tasks.row_groups), for a flat load of 16 bytes (V elements of the tile's type) a thread: thread
    u of group s holds rows (rows / S) s + b at columns c u + V a + j (c = cols / threads a group) in its
    load A b + a, i.e. element ((rows / S) s + b, c u + V a + j) at V T (A b + a) + V ((T / S) s + u) + j
    for T threads."""
    if groups == 1:
        return values
    *lead, rows, cols = values.shape
    per_load = 16 // values.element_size()
    per_group = target.num_warps * target.warp_size // groups
    chunks = cols // (per_group * per_load)
    n = len(lead)
    out = values.reshape(*lead, groups, rows // groups, per_group, chunks, per_load)
    return out.permute(*range(n), n + 1, n + 3, n, n + 2, n + 4).contiguous().reshape(*lead, rows, cols)


def _host_weight(w, schedule: Schedule) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight as the FP8 stream holds it: (values as uint8, fp32 scales per row) in the target's
    format, quantized from the model's weight or converted from a pre-quantized one (exact)."""
    fmt = schedule.weight_format
    qw = w.to_format(fmt) if isinstance(w, Fp8Weight) else quantize(w.detach().to("cpu"), fmt)
    return qw.q.to("cpu").view(torch.uint8), qw.scale.to("cpu", torch.float32)


def allocate(schedule: Schedule, weights: dict[str, torch.Tensor], device, profile: bool | str = False,
             peer_visible=None) -> Buffers:
    """peer_visible(numel, dtype) -> a zeroed tensor other GPUs can write (F32 and CNT, which a rank's
    peers store into: PyTorch symmetric memory across processes); default ordinary device memory."""
    graph, lay = schedule.graph, schedule.layout
    dtype = TORCH_DTYPES[schedule.dtype]
    W, WOFF = pack_weights(schedule, weights, device)
    table, qlen = schedule.table()
    small = torch.zeros(max(lay.sizes["small"], 1), dtype=dtype)
    emb = torch.zeros(1, dtype=dtype)
    for n in graph.nodes:
        if n.op is Op.PARAM and n.name in lay.slots and lay.slots[n.name][0] == "small":
            _, off, per_lane, lanes = lay.slots[n.name]
            w = weights[n.attrs["name"]].detach()
            if lanes:       # one rank's lanes of a per-lane scale (kogc.ir.shard)
                w = w[n.attrs.get("lane0", 0):n.attrs.get("lane0", 0) + lanes]
            elif "row0" in n.attrs:     # one rank's vocabulary shard of the LM head's bias
                w = w[n.attrs["row0"]:n.attrs["row0"] + per_lane]
            small[off:off + per_lane * max(lanes, 1)] = w.reshape(-1).to("cpu", dtype)
    for name, (arena, off, per_lane, _) in lay.slots.items():
        if arena == "small" and norm_constant(name) is not None:      # a LayerNorm's missing weight (1) or bias (0)
            small[off:off + per_lane] = norm_constant(name)
    for op in schedule.ops:
        if op.kind == "embed":
            emb = weights[graph.by_name()[op.p["table"]].attrs["name"]]
            # a tied embedding given in FP8 (its head streams the FP8 bytes): read in the model's dtype
            emb = emb.read_as(dtype) if isinstance(emb, Fp8Weight) else emb.detach()
            if op.p["pos_table"]:       # a learned position embedding's rows after the token table's
                emb = torch.cat((emb.to(dtype), weights[graph.by_name()[op.p["pos_table"]].attrs["name"]].detach().to(dtype)))
    max_pos = schedule.max_pos or 1
    # every RoPE table [max_pos, head_dim / 2], one after another (kogc.ir.executor.rope_table_offsets), then each
    # ALiBi attention's slopes (alibi_table_offsets)
    tables = [rope_angles(p, rope) for rope in rope_tables(graph) for p in range(max_pos)] if schedule.max_pos else []
    tables += [(torch.tensor(n.attrs["alibi"]["slopes"], dtype=torch.float32),) * 2 for n in graph.nodes
               if n.op is Op.ATTENTION and n.attrs.get("alibi")]
    cos = torch.cat([c for c, _ in tables]) if tables else torch.zeros(1)
    sin = torch.cat([s for _, s in tables]) if tables else torch.zeros(1)

    def z(n, dt):
        return torch.zeros(max(n, 1), dtype=dt, device=device)

    shared = peer_visible or z

    return Buffers(
        W=W, WOFF=WOFF, TABLE=torch.from_numpy(table).to(device), QLEN=torch.from_numpy(qlen).to(device),
        ACT=z(lay.sizes["act"], dtype),
        F32=shared(lay.sizes["f32"], torch.float32), KV=z(lay.sizes["kv"], dtype),
        SMALL=small.to(device), EMB=emb.to(device, dtype).contiguous(), COS=cos.contiguous().to(device),
        SIN=sin.contiguous().to(device), CNT=shared(len(schedule.events), torch.int32), ERR=z(8, torch.int32),
        OUT=z(4 + max_pos, torch.int32),   # [last token, steps done, stopped at EOS, -, token of each step]
        PROF=(torch.zeros((len(schedule.queues), table.shape[1], 9 if profile == "detail" else 3), dtype=torch.int64,
                          device=device)
              if profile else z(1, torch.int64)),
        PEERS=z(2 * max(schedule.ranks - 1, 1), torch.int64))

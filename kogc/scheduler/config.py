"""The kernel's settings (`TileConfig`) and the one place that checks them against a target."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from ..fp8 import WEIGHT_FORMATS
from .errors import SchedulerError


DEFAULT_LANE_GROUP_STAGGER = 3.0   # 3 against 2: laneformer-2b FP8 -2.7%, 7b FP8 -2.2%, 2 ranks of 2b -1.2%,
                                   # 2b fp16 and 0.5b the same; 4-6 against 3: 2b fp16 +0.0 to +1.6%, 7b FP8 +4%
DEFAULT_COST_CONTEXT = 1024         # the context the placement's cost model prices attention at
DEFAULT_PLACE_LATENCY_US = 1.0      # the publish-to-acquire latency the placement assumes

# The placement's settings: None (lane_homes: 0) in a TileConfig takes a model's shipped profile's value, else
# the default (kogc.settings.tile_config_for, with_placement).
PLACEMENT_FIELDS = ("lane_group_stagger", "lane_homes", "cost_context", "place_latency_us")

ESIZE = {"float32": 4, "float16": 2, "bfloat16": 2}     # bytes per element of a dtype the kernel stores


TILE_SLACK = 9 / 8   # a tile may hold up to 9/8 of tile_bytes (below)


def tile_rows(N, K, es, tile_bytes) -> int:
    """Rows of a matvec tile: the most (a power of two dividing N) whose K inputs of es bytes fit TILE_SLACK x
    tile_bytes. A power-of-two K fits tile_bytes exactly or not at all, so the slack only doubles the rows where
    K is within 9/8 of a power of two, the widths held as two column parts (kogc.scheduler.tasks.column_parts):
    Gemma-2-2B's 2304 as 8 rows (36 KB) instead of 4 (18 KB): -7.4%, Gemma-3-1B -4.5%, Qwen2.5-1.5B -2.1%,
    SmolLM2-135M -0.6% (docs/design.md)."""
    rows = 1
    while rows * 2 * K * es <= tile_bytes * TILE_SLACK and N % (rows * 2) == 0:
        rows *= 2
    return rows


@dataclass
class TileConfig:
    """How a model is cut into tasks and placed: the only settings of the kernel (docs/design.md says why
    each default is what it is, and which options were measured and removed)."""
    tile_bytes: int = 32 * 1024       # weight bytes per matvec task
    attn_splits: int = 0              # splits of the positions 0..pos per (lane, KV head), each cdiv(pos+1, splits);
                                      # 0: attention_splits() (16 for every preset; fewer only where Wo combines and
                                      # 16 splits' partials exceed a tile)
    attn_block: int = 0               # positions per inner step of attention; 0: with tl.dot 16 KB of keys
                                      # (head_dim 128: 64, head_dim 64: 128), at most 64 where the last split
                                      # combines (tile.attention_impl); 16 with the broadcast-product form
    elem_block: int = 512             # elements per elementwise task (a residual, a send to the peers)
    cost_context: int | None = None   # context length the cost model assumes for attention; None: the model's
                                      # shipped profile's, else DEFAULT_COST_CONTEXT
    lane_group_stagger: float | None = None   # placement: rank the upper half of the lanes this many fused ops
                                      # later: two lane groups out of phase, one streaming its MLP while the
                                      # other waits through attention (against none: laneformer-2b -4.4%).
                                      # None: the model's shipped profile's (kogc.settings.tile_config_for), else
                                      # DEFAULT_LANE_GROUP_STAGGER (laneformer-2b FP8 ships 6: -3.0% against 3)
    lane_homes: int = 0               # placement on a one-die GPU: k > 1 gives program p a home, the lanes l with
                                      # l % k == p % k, whose ready tasks it takes first (1: no homes); 0: the
                                      # model's shipped profile's, else one home a lane where a lane's matvec op
                                      # has many tiles a program, else none (kogc.scheduler.schedule.lane_homes:
                                      # laneformer-7b -14.8%)
    place_latency_us: float | None = None   # placement: publish-to-acquire latency between producer and
                                      # consumer; None: the model's shipped profile's, else DEFAULT_PLACE_LATENCY_US
    kind_us: dict | None = None       # placement cost model: measured microseconds per task of each kind
                                      # (a profile's "matvec/rmsnorm/store": 2.7, ...); others: bytes.
                                      # None: the model's shipped profile for the target, if any
                                      # (kogc.settings.tile_config_for), else bytes; {}: bytes only
    weights: str = "model"            # how matvec weights are stored: "model" (the model's dtype) or "fp8"
                                      # (E4M3, one fp32 scale per row: kogc.fp8; half the bytes of fp16)
    attn_combine_width: int = 512     # the widest attention output per lane whose splits each output-projection
                                      # task combines in its prologue; wider, the last split of each KV head to
                                      # finish combines them into o, read as a plain vector (Llama-3.2-1B's
                                      # 2048: -7.8%; the Laneformer presets' 128-512 combining so: +3.5-5.7%)
    mlp_pair_inputs: int = 1024       # W1 and W3 run as one task per (gate, up) row pair storing silu(gate) * up
                                      # where W2 would read at least this many inputs per row of its tile
                                      # (Llama-3.2-1B's 4096: -11%; laneformer-2b's 64: slower); 0: always


def _pow2(x) -> bool:
    return isinstance(x, int) and x > 0 and x & (x - 1) == 0


def validate(cfg: TileConfig, target=None) -> TileConfig:
    """Every check of the settings, in one place: a SchedulerError naming the field and the value.
    `target` (a kogc.targets.Target) adds what depends on the device."""
    def bad(name, why):
        raise SchedulerError(f"tile config: {name}={getattr(cfg, name)!r} {why}")
    if not _pow2(cfg.tile_bytes) or cfg.tile_bytes < 256:
        bad("tile_bytes", "must be a power of two of at least 256 bytes")
    if cfg.attn_splits != 0 and not _pow2(cfg.attn_splits):
        bad("attn_splits", "must be 0 (chosen for the model) or a power of two")
    if cfg.attn_block != 0 and not _pow2(cfg.attn_block):
        bad("attn_block", "must be 0 (the default for the attention form) or a power of two")
    if not _pow2(cfg.elem_block) or cfg.elem_block < 16:
        bad("elem_block", "must be a power of two of at least 16")
    if cfg.cost_context is not None and (not isinstance(cfg.cost_context, int) or isinstance(cfg.cost_context, bool)
                                         or cfg.cost_context < 1):
        bad("cost_context", "must be a positive number of positions (or null: the model's profile's, else "
            f"{DEFAULT_COST_CONTEXT})")
    if cfg.lane_group_stagger is not None and (not isinstance(cfg.lane_group_stagger, (int, float))
                                               or cfg.lane_group_stagger < 0):
        bad("lane_group_stagger", "must be a number >= 0 (or null: the model's profile's, else the default)")
    if not isinstance(cfg.lane_homes, int) or isinstance(cfg.lane_homes, bool) or cfg.lane_homes < 0:
        bad("lane_homes", "must be a number of homes >= 0 (0: chosen for the model, 1: none)")
    if cfg.place_latency_us is not None and (not isinstance(cfg.place_latency_us, (int, float))
                                             or isinstance(cfg.place_latency_us, bool) or cfg.place_latency_us < 0):
        bad("place_latency_us", f"must be a number >= 0 (or null: the model's profile's, else "
            f"{DEFAULT_PLACE_LATENCY_US})")
    if not isinstance(cfg.attn_combine_width, int) or not 0 <= cfg.attn_combine_width <= MAX_COMBINE_WIDTH:
        bad("attn_combine_width", f"must be a width from 0 to {MAX_COMBINE_WIDTH} (wider combines in the output "
            "projection's prologue do not fit the registers beside a weight tile)")
    if not isinstance(cfg.mlp_pair_inputs, int) or cfg.mlp_pair_inputs < 0:
        bad("mlp_pair_inputs", "must be a number of inputs >= 0")
    if cfg.weights not in WEIGHT_FORMATS:
        bad("weights", f"must be one of {', '.join(WEIGHT_FORMATS)}")
    if cfg.kind_us is not None:
        if not isinstance(cfg.kind_us, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and v > 0 for k, v in cfg.kind_us.items()):
            bad("kind_us", "must map task kinds (e.g. \"matvec/rmsnorm/store\") to microseconds > 0")
    if target is not None and target.num_programs < 1:
        raise SchedulerError(f"target {target.name}: no programs to place tasks on")
    return cfg


def tile_config_from_json(text: str) -> TileConfig:
    """TileConfig fields as a JSON object (what --tile-config takes) -> a checked TileConfig; a clear
    error for bad JSON, something else than an object, unknown fields or bad values."""
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as e:
        raise SchedulerError(f"tile config is not JSON ({e.msg} at character {e.pos}): {text!r}") from None
    if not isinstance(fields, dict):
        raise SchedulerError(f"tile config must be a JSON object of TileConfig fields, got {text!r}")
    return tile_config_from_fields(fields)


def tile_config_from_fields(fields: dict) -> TileConfig:
    """TileConfig fields as a dict -> a checked TileConfig; a clear error for unknown fields or bad values."""
    known = {f.name for f in dataclasses.fields(TileConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise SchedulerError(f"tile config: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return validate(dataclasses.replace(TileConfig(), **fields))


MAX_SPLITS = 16
MAX_COMBINE_WIDTH = 512


def with_placement(cfg: TileConfig, profile: dict | None = None) -> TileConfig:
    """`cfg` with the placement's settings it leaves unset (PLACEMENT_FIELDS: None, lane_homes 0) taken from
    `profile` (a model's shipped placement profile, kogc.settings), else the defaults; lane_homes stays 0 (the
    rule, kogc.scheduler.schedule.lane_homes) where the profile names none."""
    profile = profile or {}
    defaults = {"lane_group_stagger": DEFAULT_LANE_GROUP_STAGGER, "cost_context": DEFAULT_COST_CONTEXT,
                "place_latency_us": DEFAULT_PLACE_LATENCY_US, "lane_homes": 0}
    unset = {f: profile.get(f, defaults[f]) for f in PLACEMENT_FIELDS
             if getattr(cfg, f) is None or (f == "lane_homes" and cfg.lane_homes == 0)}
    if "lane_group_stagger" in unset:
        unset["lane_group_stagger"] = float(unset["lane_group_stagger"])
    return dataclasses.replace(cfg, **unset) if unset else cfg


def last_split_combines(cfg: TileConfig, width: int) -> bool:
    """Whether the last attention split of a KV head combines the splits (an attention output `width`
    wide per lane), rather than every task of the output projection in its prologue."""
    return width > cfg.attn_combine_width


# A rank holding one lane of a Laneformer (L = G): its programs idle through most of the step while the lane's
# attention splits lie on its chain, so more and shorter splits, the last combining them, cost nothing at context
# 1024 and gain where splits grow. laneformer-2b, rank 0 of 8 mirrored, against 16 splits combined by the output
# projection: H100, 2026-12-06, -0.2% at 1024 and -8.7% at 4096 (64 splits: +3.3 / -12.6%); H200, +0.2% at 1024
# (docs/multi-gpu.md, at longer contexts). With 16 splits the last split's combine alone lost 2.6% (H200).
RANK_OF_ONE_LANE_SPLITS = 32


def rank_attention(cfg: TileConfig, graph, ranks: int) -> TileConfig:
    """`cfg` for the ranks of `graph` over `ranks` GPUs: where each rank holds one of a Laneformer's lanes and the
    config leaves the splits to be chosen, RANK_OF_ONE_LANE_SPLITS splits with the last one combining them."""
    one_lane = ranks > 1 and graph.meta.get("num_lanes") == ranks and not graph.meta.get("lanes_from_heads")
    if not one_lane or cfg.attn_splits:
        return cfg
    return dataclasses.replace(cfg, attn_splits=RANK_OF_ONE_LANE_SPLITS, attn_combine_width=0)


def attention_splits(cfg: TileConfig, graph) -> TileConfig:
    """`cfg` with attn_splits chosen for the model when it is 0: 16, or where the output projection's
    tasks combine the splits, the most (at most 16) whose partials they read within a weight tile's
    bytes (splits x the lane's attention width in fp32). Measured on the H200 at context 1024, when
    every model's Wo combined: Llama-3.2-1B's shapes (one lane, 2048 wide) 2.42 ms per token with 16
    splits (128 KB of partials per 32 KB tile), 1.43 with 4 (2 and 1: 1.51, 1.63); SmolLM2's shapes
    0.91 ms with 16, 0.76 with 4; the Laneformer presets (128-512 wide per lane) keep 16."""
    if cfg.attn_splits:
        return cfg
    from ..ir.graph import Op
    widths = [w for w in (n.type.shape[0] for n in graph.nodes if n.op is Op.ATTENTION)
              if not last_split_combines(cfg, w)]
    splits = MAX_SPLITS
    while widths and splits > 1 and splits * max(widths) * 4 > cfg.tile_bytes:
        splits //= 2
    return dataclasses.replace(cfg, attn_splits=splits)

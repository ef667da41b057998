"""The settings a compile of a model uses, before any scheduling: the interpreter's tiles, the placement
profile a model ships (its measured task times) merged into the TileConfig, and the target fitted to the
GPU at hand. Everything that schedules a model for a kernel (kogc.compile, kogc compile, kogc analyze, a
rank of several GPUs) takes them from here, so that each places alike."""
from __future__ import annotations

import dataclasses

import torch

from .errors import KogcError
from .fp8 import WEIGHT_FORMATS
from .scheduler import TileConfig
from .scheduler.config import PLACEMENT_FIELDS, tile_config_from_fields, with_placement
from .scheduler.errors import SchedulerError
from .targets import ALIASES, Target, get_target, target_for_device

# The interpreter runs programs one after another: big tiles keep the task count (and time) down.
INTERPRETER_TILES = TileConfig(tile_bytes=1 << 20, attn_splits=2, attn_block=16, elem_block=4096)

PLACEMENT_ATTRIBUTE = "kogc_placement"


def placement_profiles(module: torch.nn.Module) -> list[dict]:
    """The placement profiles a model carries (its `kogc_placement` attribute: one dict or a list of
    them, each {"tile_bytes": int, "kind_us": {task kind: microseconds}, optionally "target": name,
    "weights": the format it was measured with ("model" if absent, or "fp8"), and the placement settings that
    format measured best with on one GPU (PLACEMENT_FIELDS: "lane_group_stagger", "lane_homes" >= 1,
    "cost_context", "place_latency_us", checked as a TileConfig checks them)}), checked; [] if it carries
    none."""
    value = getattr(module, PLACEMENT_ATTRIBUTE, None)
    if value is None:
        return []
    profiles = value if isinstance(value, (list, tuple)) else [value]
    for p in profiles:
        ok = (isinstance(p, dict) and isinstance(p.get("tile_bytes"), int) and isinstance(p.get("kind_us"), dict)
              and all(isinstance(k, str) and isinstance(v, (int, float)) and v > 0 for k, v in p["kind_us"].items())
              and (p.get("target") is None or str(p["target"]).lower() in ALIASES)
              and p.get("weights", "model") in WEIGHT_FORMATS
              and _placement_settings_ok({f: p[f] for f in PLACEMENT_FIELDS if f in p}))
        if not ok:
            raise KogcError(f"{type(module).__name__}.{PLACEMENT_ATTRIBUTE}: a placement profile is "
                            f"{{\"tile_bytes\": int, \"kind_us\": {{kind: us > 0}}, \"target\": name, \"weights\": "
                            f"{' | '.join(WEIGHT_FORMATS)}, and optionally the TileConfig settings "
                            f"{', '.join(PLACEMENT_FIELDS)} (lane_homes >= 1)}}, got {p!r}")
    return list(profiles)


def _placement_settings_ok(placed: dict) -> bool:
    """A profile's placement settings: each set (not null; lane_homes a count >= 1), as a TileConfig checks them."""
    if any(v is None for v in placed.values()) or placed.get("lane_homes") == 0:
        return False
    try:
        tile_config_from_fields(placed)
    except SchedulerError:
        return False
    return True


def placement_profile(module: torch.nn.Module, target: Target, tile_bytes: int, weights: str = "model") -> dict | None:
    """The profile a model ships for this target, tile size and weight format; failing one of this target's,
    one of another target of the same architecture (None: none applies). Task times and the lane groups' best
    offset move with the format: laneformer-2b's FP8 tasks are placed with their own times and offset (-3.8%
    against fp16's times and the default offset). They are the SM's more than the memory's: on an H100,
    laneformer-2b placed with its H200 profiles ran 1.1% (fp16) and 7.4% (FP8) faster than placed by the
    bytes model (docs/performance.md, On an H100), and with fp16 times measured on an H100 0.9% faster again."""
    fits = [p for p in placement_profiles(module)
            if p["tile_bytes"] == tile_bytes and p.get("weights", "model") == weights]
    for same in (lambda t: t.name == target.name, lambda t: t.arch == target.arch):
        for p in fits:
            name = p.get("target")
            if name is None or same(get_target(str(name))):
                return p
    return None


def tile_config_for(module: torch.nn.Module, target: Target, tile_config: TileConfig | None = None,
                    interpret: bool = False, weights: str = "model", gpus: int = 1) -> TileConfig:
    """The settings a compile of `module` uses: `tile_config` (else the defaults, the interpreter's
    under the interpreter), with the placement filled in where the config leaves it unset: kind_us and the
    placement settings (PLACEMENT_FIELDS) from the model's shipped profile for this target, tile size and
    weight format, else none (the bytes model) and the defaults (with_placement). weights="fp8" sets
    TileConfig.weights (a tile config may also ask for it itself). A profile's placement settings were measured
    on one GPU, where it places all the lanes: the ranks of gpus > 1, each a share of them, take its task times
    and the defaults (the rule's homes, kogc.scheduler.schedule.lane_homes). On them laneformer-2b's one-GPU
    settings (four homes, placed for context 2048) read +18% at G = 2 in the speed model, +3% without the homes
    (kogc predict at context 1024). Anything that schedules a model for a kernel (kogc compile, kogc analyze)
    should go through this, so that it places as kogc.compile does."""
    cfg = tile_config or (INTERPRETER_TILES if interpret else TileConfig())
    if weights != "model":
        cfg = dataclasses.replace(cfg, weights=weights)
    profile = placement_profile(module, target, cfg.tile_bytes, cfg.weights) or {}
    if gpus > 1:
        profile = {k: v for k, v in profile.items() if k not in PLACEMENT_FIELDS}
    if cfg.kind_us is None and profile.get("kind_us"):
        cfg = dataclasses.replace(cfg, kind_us=dict(profile["kind_us"]))
    return with_placement(cfg, profile)


def device_target(target: Target, device: str | torch.device = "cuda", num_warps: int | None = None,
                  max_registers: int | None = None) -> Target:
    """`target` fitted to the CUDA device (its SMs, register file, L2, memory), with the programs per SM
    counted at the warps and register cap the kernel is launched with."""
    launched = dataclasses.replace(target, num_warps=num_warps or target.num_warps,
                                   max_registers=max_registers or target.max_registers)
    return target_for_device(launched, torch.cuda.get_device_properties(torch.device(device)))


def default_target() -> str:
    """The target of the GPU at hand: mi300x on a ROCm build of PyTorch (torch.cuda is HIP there), the
    kind of the CUDA device where one is present (target_named_for), else h200 (no GPU: the interpreter and
    ahead-of-time builds)."""
    if getattr(torch.version, "hip", None):
        return "mi300x"
    if torch.cuda.is_available():
        return target_named_for(torch.cuda.get_device_name(torch.cuda.current_device()))
    return "h200"


def target_named_for(device_name: str) -> str:
    """The NVIDIA target a CUDA device's name stands for: h100 for an H100 ("NVIDIA H100 80GB HBM3"), else
    h200, whose description target_for_device fits to any sm_90 part (and refuses another architecture)."""
    return "h100" if "H100" in device_name.upper() else "h200"


def runs_here(tgt: Target) -> bool:
    """Whether this machine's GPU runs kernels for `tgt`: a CUDA GPU for an NVIDIA target, a ROCm
    (HIP) one for an AMD target."""
    hip = bool(getattr(torch.version, "hip", None))
    return torch.cuda.is_available() and (tgt.vendor == "amd") == hip

"""`kogc.compile(module, target=...)`: trace, schedule, generate, pack, allocate."""
from __future__ import annotations

import dataclasses

import torch

from .errors import KogcError
from .fp8 import WEIGHT_FORMATS, Fp8Weight
from .frontend import decode_step, to_ir
from .runtime.kernel import CompiledKernel, weights_of
from .scheduler import TileConfig, build_schedule
from .scheduler.config import tile_config_from_fields, with_stagger
from .targets import ALIASES, Target, get_target, target_for_device

# The interpreter runs programs one after another: big tiles keep the task count (and time) down.
INTERPRETER_TILES = TileConfig(tile_bytes=1 << 20, attn_splits=2, attn_block=16, elem_block=4096)

PLACEMENT_ATTRIBUTE = "kogc_placement"


def placement_profiles(module: torch.nn.Module) -> list[dict]:
    """The placement profiles a model carries (its `kogc_placement` attribute: one dict or a list of
    them, each {"tile_bytes": int, "kind_us": {task kind: microseconds}, optionally "target": name,
    "weights": the format it was measured with ("model" if absent, or "fp8") and "lane_group_stagger":
    the placement setting that format measured best with}), checked; [] if it carries none."""
    value = getattr(module, PLACEMENT_ATTRIBUTE, None)
    if value is None:
        return []
    profiles = value if isinstance(value, (list, tuple)) else [value]
    for p in profiles:
        stagger = p.get("lane_group_stagger") if isinstance(p, dict) else None
        ok = (isinstance(p, dict) and isinstance(p.get("tile_bytes"), int) and isinstance(p.get("kind_us"), dict)
              and all(isinstance(k, str) and isinstance(v, (int, float)) and v > 0 for k, v in p["kind_us"].items())
              and (p.get("target") is None or str(p["target"]).lower() in ALIASES)
              and p.get("weights", "model") in WEIGHT_FORMATS
              and (stagger is None or (isinstance(stagger, (int, float)) and stagger >= 0)))
        if not ok:
            raise KogcError(f"{type(module).__name__}.{PLACEMENT_ATTRIBUTE}: a placement profile is "
                            f"{{\"tile_bytes\": int, \"kind_us\": {{kind: us > 0}}, \"target\": name, \"weights\": "
                            f"{' | '.join(WEIGHT_FORMATS)}, \"lane_group_stagger\": number >= 0}}, got {p!r}")
    return list(profiles)


def placement_profile(module: torch.nn.Module, target: Target, tile_bytes: int, weights: str = "model") -> dict | None:
    """The profile a model ships for this target, tile size and weight format (None: none applies).
    Task times and the lane groups' best offset move with the format: laneformer-2b's FP8 tasks are
    placed with their own times and offset (-3.8% against fp16's times and the default offset)."""
    for p in placement_profiles(module):
        name = p.get("target")
        if ((name is None or ALIASES[str(name).lower()] == target.name) and p["tile_bytes"] == tile_bytes
                and p.get("weights", "model") == weights):
            return p
    return None


def tile_config_for(module: torch.nn.Module, target: Target, tile_config: TileConfig | None = None,
                    interpret: bool = False, weights: str = "model") -> TileConfig:
    """The settings a compile of `module` uses: `tile_config` (else the defaults, the interpreter's
    under the interpreter), with the placement filled in where the config leaves it unset: kind_us and
    lane_group_stagger from the model's shipped profile for this target, tile size and weight format,
    else none (the bytes model) and DEFAULT_LANE_GROUP_STAGGER. weights="fp8" sets TileConfig.weights
    (a tile config may also ask for it itself). Anything that schedules a model for a kernel (kogc
    compile, kogc analyze) should go through this, so that it places as kogc.compile does."""
    cfg = tile_config or (INTERPRETER_TILES if interpret else TileConfig())
    if weights != "model":
        cfg = dataclasses.replace(cfg, weights=weights)
    profile = placement_profile(module, target, cfg.tile_bytes, cfg.weights) or {}
    if cfg.kind_us is None and profile.get("kind_us"):
        cfg = dataclasses.replace(cfg, kind_us=dict(profile["kind_us"]))
    return with_stagger(cfg, profile.get("lane_group_stagger"))


def device_target(target: Target, device: str | torch.device = "cuda", num_warps: int | None = None,
                  max_registers: int | None = None) -> Target:
    """`target` fitted to the CUDA device (its SMs, register file, L2, memory), with the programs per SM
    counted at the warps and register cap the kernel is launched with."""
    launched = dataclasses.replace(target, num_warps=num_warps or target.num_warps,
                                   max_registers=max_registers or target.max_registers)
    return target_for_device(launched, torch.cuda.get_device_properties(torch.device(device)))


def default_target() -> str:
    """The target of the GPU at hand: mi300x on a ROCm build of PyTorch (torch.cuda is HIP there),
    else h200 (also with no GPU: the interpreter)."""
    return "mi300x" if getattr(torch.version, "hip", None) else "h200"


def runs_here(tgt: Target) -> bool:
    """Whether this machine's GPU runs kernels for `tgt`: a CUDA GPU for an NVIDIA target, a ROCm
    (HIP) one for an AMD target."""
    hip = bool(getattr(torch.version, "hip", None))
    return torch.cuda.is_available() and (tgt.vendor == "amd") == hip


def compile(module: torch.nn.Module, target: str | None = None, device: str | None = None,
            interpret: bool | None = None, tile_config: TileConfig | None = None,
            num_programs: int | None = None, profile: bool | str = False, num_warps: int | None = None,
            max_registers: int | None = None, gpus: int = 1, one_gpu: bool | str = False, max_len: int | None = None,
            weights="model"):
    """Compile a decode-step module into one persistent kernel.

    `target`: h200 | h100 | mi300x; None: the GPU at hand's kind (mi300x on a ROCm build of PyTorch,
    else h200). On a machine with a GPU of the target's vendor the kernel runs there (parallel
    placement, all programs resident; on ROCm untested: no AMD GPU here), and an NVIDIA target is fitted
    to that GPU (kogc.targets.target_for_device: its SM count and the programs
    its register file holds; a GPU of another architecture than the target's is refused). Without one,
    or with interpret=True, the same generated kernel runs under Triton's interpreter on CPU with a
    sequential placement (one queue in topological order).

    Tuning knobs (GPU): tile_config (a TileConfig or a dict of its fields: task sizes, attention; its kind_us, if unset, comes from the
    model's shipped placement profile where one matches: tile_config_for), num_programs (the persistent
    grid; at most what the cooperative launch can keep resident), num_warps per program, max_registers
    (a ptxas cap per thread, so that more programs fit an SM; spills if set too low). profile=True records
    (start, after the waits, end) of every task (kogc.runtime.profile); "detail" adds when a matvec's
    operands arrived and when its publish began (an extra reduction per task: for diagnosis only).

    gpus=G > 1: delayed tensor parallelism, the model's lanes spread over G ranks (G divides the
    lanes), each rank one persistent kernel; returns a RankedKernel with the same step/generate.
    Under the interpreter all ranks run in this process; on a GPU with one_gpu=True, all ranks share
    this one GPU (each its share of the programs: for testing the protocol); started by torchrun with
    G processes, each process compiles and runs its own rank (kogc.runtime.distributed).
    one_gpu="mirror": rank 0 alone, with all of this device's programs, each peer mirrored by the rank
    itself (kogc.runtime.ranks.mirror_rank): a CompiledKernel of the model whose G lane groups are copies
    of rank 0's (its vocabulary shard's logits), timing one GPU's share of a G-GPU step with free exchanges.

    A `transformers` causal LM is compiled as its decode step over a static KV cache of `max_len`
    positions (default min(4096, the model's max_position_embeddings)): kogc.frontend.hf.

    weights: "model" streams the matvec weights in the model's dtype; "fp8" as FP8 E4M3 with one fp32
    scale per row, quantized when the kernel is packed (kogc.fp8; embedding, norms and KV cache stay in
    the model's dtype); a dict {parameter name: kogc.fp8.Fp8Weight} (kogc.fp8.from_state_dict of a
    checkpoint; kogc.fp8.compensate_head for a transformers model's LM head, its rounding compensated over
    calibration text) gives weights already in FP8, packed as they are, the others quantized."""
    tile_config = _check_options(module, tile_config, target, device, gpus=gpus, num_programs=num_programs,
                                 num_warps=num_warps, max_registers=max_registers, max_len=max_len)
    target = target or default_target()
    given = module
    module = decode_step(module, max_len)
    weights, prequantized = weight_format(step_names(weights, given, module), module)
    if one_gpu not in (False, True, "mirror"):
        raise KogcError(f"one_gpu={one_gpu!r}: False, True (every rank on this GPU) or 'mirror' (rank 0 alone, its "
                        f"peers mirrored)")
    if gpus != 1:
        return _compile_ranked(module, target, device, interpret, tile_config, num_programs, profile, num_warps,
                               max_registers, gpus, one_gpu, weights, prequantized)
    tgt = get_target(target)
    if interpret is None:
        interpret = not runs_here(tgt)
    device = device or ("cpu" if interpret else "cuda")
    if not interpret and tgt.vendor == "nvidia" and torch.device(device).type == "cuda":
        tgt = device_target(tgt, device, num_warps, max_registers)
    graph = to_ir(module)
    placement = "sequential" if interpret else "parallel"
    cfg = tile_config_for(module, tgt, tile_config, interpret, weights)
    if interpret and cfg.weights == "fp8" and tgt.fp8_format != "e4m3fn":
        raise KogcError(f"Triton's interpreter cannot run {tgt.name}'s FP8 format ({tgt.fp8_format}); compile it ahead of "
                        f"time (kogc compile --target {tgt.name} --weights fp8 --out DIR) or interpret for h200")
    schedule = build_schedule(graph, tgt, placement, cfg, num_programs=num_programs)
    return CompiledKernel(graph, schedule, weights_of(module, graph, prequantized), device, interpret, profile=profile,
                          num_warps=num_warps or tgt.num_warps,
                          max_registers=max_registers or tgt.max_registers)


def _check_options(module, tile_config, target, device, **counts) -> TileConfig | None:
    """compile's arguments of the right kinds, before any work (a KogcError naming the first that is not);
    returns tile_config as a TileConfig (a dict of its fields is taken too)."""
    if not isinstance(module, torch.nn.Module):
        raise KogcError(f"kogc.compile takes a torch.nn.Module (a decode step forward(token, pos), or a transformers "
                        f"causal LM), got {type(module).__name__}")
    for name, x in counts.items():        # gpus, num_programs, num_warps, max_registers, max_len: None or >= 1
        if x is not None and not (isinstance(x, int) and not isinstance(x, bool) and (x >= 1 or name == "gpus")):
            raise KogcError(f"{name} must be a whole number >= 1, got {x!r}")   # (gpus < 1: the sharding says so)
    if counts["num_warps"] is not None and counts["num_warps"] & (counts["num_warps"] - 1):
        raise KogcError(f"num_warps must be a power of two, got {counts['num_warps']}")
    if target is not None:
        try:
            get_target(target)
        except KeyError as e:
            raise KogcError(e.args[0]) from None
    if device is not None:
        try:
            torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise KogcError(f"device {device!r}: {str(e).splitlines()[0][:120]}") from None
    if isinstance(tile_config, dict):
        return tile_config_from_fields(tile_config)
    if tile_config is not None and not isinstance(tile_config, TileConfig):
        raise KogcError(f"tile_config must be a kogc.scheduler.TileConfig or a dict of its fields, got "
                        f"{type(tile_config).__name__}")
    return tile_config


def step_names(weights, given: torch.nn.Module, step: torch.nn.Module):
    """A dict of pre-quantized weights named as in the module the caller gave (a transformers model),
    renamed as in its decode step (the same tensors); names the step already has are kept."""
    if not isinstance(weights, dict) or step is given:
        return weights
    mine = dict(step.named_parameters(remove_duplicate=False))
    theirs = dict(given.named_parameters(remove_duplicate=False))
    rename = {k: next((n for n, p in mine.items() if p is theirs[k]), k) for k in weights
              if k not in mine and k in theirs}
    return {rename.get(k, k): v for k, v in weights.items()}


def weight_format(weights, module: torch.nn.Module) -> tuple[str, dict]:
    """compile's `weights` -> (TileConfig.weights, pre-quantized weights by parameter name). "fp8" takes
    the weights a module holds in FP8 already (its `kogc_fp8_weights`: kogc.frontend.transformers_dir)."""
    if weights == "fp8":
        weights = getattr(module, "kogc_fp8_weights", None) or "fp8"
    prequantized = {}
    if isinstance(weights, dict):
        bad = [k for k, v in weights.items() if not isinstance(v, Fp8Weight)]
        if bad:
            raise KogcError(f"weights: a dict gives pre-quantized weights as kogc.fp8.Fp8Weight; {bad[0]} is a "
                            f"{type(weights[bad[0]]).__name__}")
        prequantized, weights = weights, "fp8"
    if weights not in WEIGHT_FORMATS:
        raise KogcError(f"weights={weights!r}: one of {', '.join(WEIGHT_FORMATS)}, or a dict of kogc.fp8.Fp8Weight")
    return weights, prequantized


def _compile_ranked(module, target, device, interpret, tile_config, num_programs, profile, num_warps, max_registers,
                    gpus, one_gpu, weights="model", prequantized=None):
    from .ir.shard import check_shardable
    from .runtime.ranks import RankedKernel
    from .scheduler.ranks import build_rank_schedules
    tgt = get_target(target)
    if interpret is None:
        interpret = not runs_here(tgt)
    graph = to_ir(module)
    check_shardable(graph, gpus)
    if not interpret:
        from .runtime import distributed
        if distributed.launched():
            return distributed.compile_rank(module, graph, tgt, tile_config, num_programs, num_warps, max_registers,
                                            gpus, profile, weights, prequantized)
        if not one_gpu:
            raise KogcError(f"gpus={gpus}: start one process per GPU (torchrun --nproc-per-node {gpus}, or "
                            f"`kogc run/bench --gpus {gpus}`), or pass one_gpu=True to run every rank on this GPU")
    device = device or ("cpu" if interpret else "cuda")
    if not interpret:
        tgt = device_target(tgt, device, num_warps, max_registers)
    placement = "sequential" if interpret else "parallel"
    cfg = tile_config_for(module, tgt, tile_config, interpret, weights)
    if one_gpu == "mirror":       # rank 0 with all of this GPU's programs, its peers mirrored by itself
        from .runtime.ranks import mirror_rank
        schedules = build_rank_schedules(graph, gpus, tgt, placement, cfg, num_programs=num_programs)
        return mirror_rank(schedules, weights_of(module, graph, prequantized), device, interpret, profile=profile,
                           num_warps=num_warps or tgt.num_warps, max_registers=max_registers or tgt.max_registers)
    # one GPU shared by the ranks: each gets its share of the resident programs
    programs = num_programs or (None if interpret else max(1, tgt.num_programs // gpus))
    schedules = build_rank_schedules(graph, gpus, tgt, placement, cfg, num_programs=programs)
    return RankedKernel(graph, schedules, weights_of(module, graph, prequantized), device, interpret,
                        num_warps=num_warps or tgt.num_warps, max_registers=max_registers or tgt.max_registers,
                        profile=profile)

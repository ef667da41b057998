"""`kogc.compile(module, target=...)`: trace, schedule, generate, pack, allocate."""
from __future__ import annotations

import torch

from .errors import KogcError
from .fp8 import WEIGHT_FORMATS, Fp8Weight
from .frontend import decode_step, to_ir
from .runtime.kernel import CompiledKernel, weights_of
from .scheduler import TileConfig, build_schedule
from .scheduler.config import tile_config_from_fields
from .settings import device_target, default_target, runs_here, tile_config_for
from .targets import get_target


def compile(module: torch.nn.Module, target: str | None = None, device: str | None = None,
            interpret: bool | None = None, tile_config: TileConfig | None = None,
            num_programs: int | None = None, profile: bool | str = False, num_warps: int | None = None,
            max_registers: int | None = None, gpus: int = 1, one_gpu: bool | str = False, max_len: int | None = None,
            weights="model"):
    """Compile a decode-step module into one persistent kernel.

    `target`: h200 | h100 | mi300x; None: the GPU at hand's kind (mi300x on a ROCm build of PyTorch,
    h100 on an H100, else h200). On a machine with a GPU of the target's vendor the kernel runs there (parallel
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
    graph = to_ir(module, gpus=gpus)     # (an ordinary decoder: its heads and MLP width cut into G lanes)
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
    cfg = tile_config_for(module, tgt, tile_config, interpret, weights, gpus)
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

"""`kogc.compile(module, target=...)`: trace, schedule, generate, pack, allocate."""
from __future__ import annotations

import torch

from .frontend import to_ir
from .runtime.kernel import CompiledKernel, weights_of
from .scheduler import TileConfig, build_schedule
from .targets import get_target

# The interpreter runs programs one after another: big tiles keep the task count (and time) down.
INTERPRETER_TILES = TileConfig(tile_bytes=1 << 20, attn_splits=2, attn_block=16, elem_block=4096)


def compile(module: torch.nn.Module, target: str = "h200", device: str | None = None,
            interpret: bool | None = None, tile_config: TileConfig | None = None,
            num_programs: int | None = None, profile: bool | str = False, num_warps: int | None = None,
            max_registers: int | None = None, cooperative: bool = True) -> CompiledKernel:
    """Compile a decode-step module into one persistent kernel.

    On a machine with a CUDA GPU the kernel runs there (parallel placement, all programs resident).
    Without one, or with interpret=True, the same generated kernel runs under Triton's interpreter on
    CPU with a sequential placement (one queue in topological order).

    Tuning knobs (GPU): tile_config (task sizes, attention), num_programs (the persistent grid; at most
    what the cooperative launch can keep resident), num_warps per program, max_registers (a ptxas
    cap per thread, so that more programs fit an SM; spills if set too low). profile=True records
    (start, after the waits, end) of every task (kogc.runtime.profile); "detail" adds when a matvec's
    operands arrived and when its publish began (an extra reduction per task: for diagnosis only).
    cooperative=False launches without the cooperative attribute (the driver then no longer checks that
    every program is resident at once: for measuring what the attribute costs)."""
    tgt = get_target(target)
    if interpret is None:
        interpret = not (torch.cuda.is_available() and tgt.vendor == "nvidia")
    device = device or ("cpu" if interpret else "cuda")
    graph = to_ir(module)
    placement = "sequential" if interpret else "parallel"
    cfg = tile_config or (INTERPRETER_TILES if interpret else TileConfig())
    schedule = build_schedule(graph, tgt, placement, cfg, num_programs=num_programs)
    return CompiledKernel(graph, schedule, weights_of(module, graph), device, interpret, profile=profile,
                          num_warps=num_warps or tgt.num_warps,
                          max_registers=max_registers or tgt.max_registers, cooperative=cooperative)

"""A target is a plain description of a GPU: numbers the scheduler reads, names codegen reads."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str                    # what users type: --target h200
    vendor: str                  # "nvidia" | "amd"
    arch: str                    # sm_90, gfx942
    triton_backend: str          # GPUTarget backend: "cuda" | "hip"
    triton_arch: object          # GPUTarget arch: 90 | "gfx942"
    compute_units: int           # SMs / CUs: a persistent grid puts programs_per_unit programs on each
    warp_size: int
    programs_per_unit: int       # resident programs per unit in the persistent grid
    num_warps: int               # warps per program
    hbm_bytes: int
    hbm_read_bw: float           # bytes/s, measured read bandwidth (datasheet if not measured)
    hbm_bw_datasheet: float
    l2_bytes: int                # per die / XCD on AMD
    last_level_cache_bytes: int  # L2 on NVIDIA, Infinity Cache on MI300X
    dies: int = 1                # XCDs on MI300X: block i runs on die i % dies
    cross_die_hop_us: float = 0.0  # what a flag between programs on two dies costs over one within a die
    timer_asm: str = ""          # inline asm reading a ns clock into $0 (profiling); "" = not available
    l2_prefetch_asm: str = ""    # inline asm asking L2 for the line at address $1 ($0: a dummy); "" = none
    release_fence_asm: str = ""  # inline asm every thread runs before the barrier that precedes a counter
                                 # publish ($0: a dummy), where the compiler's own release sequence is not
                                 # trusted alone; "" = none
    release_fence_sys_asm: str = ""  # the same before a publish to another GPU
    fp8_format: str = "e4m3fn"   # the FP8 weights it streams (kogc.fp8.FORMATS): E4M3FN, or E4M3FNUZ on gfx942
    warp_row_groups: bool = False  # tiles streamed in row groups of one warp each, so that each row's sum
                                   # stays in its warp (kogc.scheduler.tasks.row_groups; measured on an
                                   # H200: laneformer-2b FP8 -5.3%, 7b FP8 -1.2%, 0.5b fp16 -2.4%)
    volatile_loads: bool = True  # volatile loads are sound in Triton for this target (not AMD in 3.6)
    max_registers: int | None = None   # ptxas cap per thread (None: the compiler's choice), so that
                                       # programs_per_unit programs fit one unit's register file
    registers_per_unit: int = 0  # 32-bit registers per SM / CU (0: not stated); target_for_device reads
                                 # the device's and derives programs_per_unit from it
    device: str = ""             # the device this description was fitted to (target_for_device); "": datasheet
    notes: str = ""

    @property
    def num_programs(self) -> int:
        return self.compute_units * self.programs_per_unit

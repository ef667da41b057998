"""Fit a target's description to the GPU at hand: its SM count, register file, L2 and memory.

`get_target("h200")` is the datasheet; `target_for_device(target, torch.cuda.get_device_properties(i))` is
that target as this device has it. Pure: it reads the properties object it is given (any object with
the fields of torch's `_CudaDeviceProperties`), so it is testable without a GPU.
"""
from __future__ import annotations

import dataclasses
import re

from ..errors import KogcError
from .base import Target

NVIDIA_MAX_REGISTERS = 255      # registers per thread when ptxas is not capped


def arch_capability(arch: str) -> tuple[int, int]:
    """sm_90 -> (9, 0), sm_100a -> (10, 0): the compute capability an NVIDIA arch name stands for."""
    m = re.fullmatch(r"sm_(\d+)(\d)[a-z]?", arch)
    if not m:
        raise KogcError(f"{arch!r} is not an NVIDIA arch name (sm_XY)")
    return int(m.group(1)), int(m.group(2))


def programs_per_unit(target: Target, registers_per_unit: int) -> int:
    """How many programs of num_warps warps fit one SM's register file at the target's register cap:
    programs * num_warps * warp_size * max_registers <= registers per SM (H200: 3 x 4 x 32 x 168 = 64,512
    <= 65,536)."""
    per_program = target.num_warps * target.warp_size * (target.max_registers or NVIDIA_MAX_REGISTERS)
    return registers_per_unit // per_program


def target_for_device(target: Target, props) -> Target:
    """`target` with the device's SM count, L2 bytes, memory bytes and the programs per SM its register
    file holds (regs_per_multiprocessor; where torch does not report it, the target's own figure).
    A KogcError if the device is not of the target's architecture (its compute capability differs)."""
    if target.vendor != "nvidia":
        raise KogcError(f"target {target.name}: fitting to a device is for NVIDIA targets ({target.vendor} given)")
    name = getattr(props, "name", "?")
    want = arch_capability(target.arch)
    have = (int(props.major), int(props.minor))
    if have != want:
        raise KogcError(f"device {name} has compute capability {have[0]}.{have[1]}, but target {target.name} is "
                        f"{target.arch} ({want[0]}.{want[1]}): choose the target of this GPU")
    units = int(props.multi_processor_count)
    if units < 1:
        raise KogcError(f"device {name} reports {units} multiprocessors")
    regs = int(getattr(props, "regs_per_multiprocessor", 0) or target.registers_per_unit or 0)
    if regs:
        per_unit = programs_per_unit(target, regs)
        if per_unit < 1:
            raise KogcError(f"device {name}: {regs} registers per SM do not hold one program of "
                            f"{target.num_warps} warps at {target.max_registers or NVIDIA_MAX_REGISTERS} "
                            f"registers per thread (target {target.name})")
        max_threads = int(getattr(props, "max_threads_per_multi_processor", 0) or 0)
        if max_threads:
            per_unit = min(per_unit, max(1, max_threads // (target.num_warps * target.warp_size)))
    else:
        per_unit = target.programs_per_unit
    l2 = int(getattr(props, "L2_cache_size", 0) or target.l2_bytes)
    return dataclasses.replace(
        target, compute_units=units, programs_per_unit=per_unit, registers_per_unit=regs,
        l2_bytes=l2, last_level_cache_bytes=l2, hbm_bytes=int(getattr(props, "total_memory", 0) or target.hbm_bytes),
        device=str(name))

"""The machine code of each code variant alone (`kogc compile --per-variant`).

The monokernel is one function: its disassembly summary mixes every task body. Here each variant is
compiled into a kernel whose dispatch holds only that body (same loop, waits and publish), so the
rows differ by what the bodies cost: registers, spills, global loads by width (a 16- or 32-bit load
where 128 bits would do is a missing alignment hint), barriers. Compile-only: such a kernel cannot
run the schedule.
"""
from __future__ import annotations

import os
from typing import Callable

from ..scheduler import Schedule
from .aot import compile_kernel, disassembly_summary
from .render import KERNEL_NAME, render, signature

COLUMNS = ("registers", "spill_store_bytes", "ld_global_bits", "bar_sync", "st_global")   # NVIDIA's names


def variant_summaries(schedule: Schedule, out_dir: str,
                      progress: Callable[[int, int, tuple], None] | None = None) -> list[dict]:
    """One row per code variant: its id, the variant tuple and the disassembly summary's COLUMNS
    (those the target's tools report). Sources and binaries go to out_dir/<id>.py and out_dir/<id>/."""
    target = schedule.target
    sig, consts = signature(schedule)
    options = {"maxnreg": target.max_registers} if target.max_registers else None
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for i, v in enumerate(schedule.variants):
        if progress:
            progress(i, len(schedule.variants), v)
        path = os.path.join(out_dir, f"{i}.py")
        with open(path, "w") as f:
            f.write(render(schedule, only_variant=i))
        arts = compile_kernel(path, KERNEL_NAME, sig, consts, target.name, os.path.join(out_dir, str(i)),
                              num_warps=target.num_warps, options=options)
        rows.append({"id": i, "variant": v, **_columns(disassembly_summary(arts))})
    return rows


def _columns(summary: dict) -> dict:
    """COLUMNS from a disassembly summary; AMD's names mapped onto them (VGPRs, scratch bytes, and
    global/buffer loads as 128-bit dwordx4 and narrower ones, counted as 32)."""
    if summary.get("backend") == "hip":
        wide = summary.get("global_load_dwordx4", 0) + summary.get("buffer_load_dwordx4", 0)
        narrow = summary.get("global_load", 0) + summary.get("buffer_load", 0) - wide
        summary = {"registers": summary.get("vgprs"), "spill_store_bytes": summary.get("scratch_bytes"),
                   "ld_global_bits": {b: n for b, n in ((32, narrow), (128, wide)) if n}}
    return {k: summary[k] for k in COLUMNS if summary.get(k) is not None}


def format_variant_table(rows: list[dict]) -> str:
    """A text table of variant_summaries' rows; loads as bits:count."""
    lines = ["id  registers  spills(B)  barriers  stores  loads (bits:count)  variant"]
    for r in rows:
        loads = " ".join(f"{b}:{n}" for b, n in sorted(r.get("ld_global_bits", {}).items()))
        lines.append(f"{r['id']:<3} {r.get('registers', '-')!s:>9}  {r.get('spill_store_bytes', '-')!s:>9}  "
                     f"{r.get('bar_sync', '-')!s:>8}  {r.get('st_global', '-')!s:>6}  {loads:<18}  "
                     f"{'/'.join(map(str, r['variant']))}")
    return "\n".join(lines)

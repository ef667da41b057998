"""NVIDIA H200 SXM: 132 SMs, 141 GB HBM3e, 4.8 TB/s datasheet, ~4.25 TB/s read measured."""
from .base import Target

H200 = Target(
    name="h200", vendor="nvidia", arch="sm_90", triton_backend="cuda", triton_arch=90,
    compute_units=132, warp_size=32,
    # 3 programs x 4 warps per SM, registers capped at 168 (3 x 128 threads x 168 = 64,512 of 65,536):
    # measured 4-7% faster than 2 programs at 255 registers on laneformer-2b (docs/design.md)
    programs_per_unit=3, num_warps=4, max_registers=168, registers_per_unit=65536, warp_row_groups=True,
    # read bandwidth measured on an H200 (kogc bench measures it again in every run, for its floor)
    hbm_bytes=141 * 10**9, hbm_read_bw=4.25e12, hbm_bw_datasheet=4.8e12,
    l2_bytes=60 * 2**20, last_level_cache_bytes=60 * 2**20,
    timer_asm="mov.u64 $0, %globaltimer;",
    l2_prefetch_asm="mov.u32 $0, 0; prefetch.global.L2 [$1];",
    notes="acquire: ld.global.acquire.gpu via atomic_add(0); publish: bar.sync then red.release.gpu",
)

"""NVIDIA H100 SXM: the H200's SM (sm_90, 132 SMs) with 80 GB of HBM3, 3.35 TB/s datasheet, ~3.0 TB/s read
measured."""
from .base import Target

H100 = Target(
    name="h100", vendor="nvidia", arch="sm_90", triton_backend="cuda", triton_arch=90,
    compute_units=132, warp_size=32,
    # the same SM and register file as the H200: 3 programs x 4 warps per SM at 168 registers
    # (3 x 128 threads x 168 = 64,512 of 65,536), the H200's measured best
    programs_per_unit=3, num_warps=4, max_registers=168, registers_per_unit=65536, warp_row_groups=True,
    # read bandwidth measured on an H100 80GB HBM3 (kogc bench's 2 GiB reduction: 2.89-3.03 TB/s over ten
    # readings, 2026-12-05; kogc bench measures it again in every run, for its floor)
    hbm_bytes=80 * 10**9, hbm_read_bw=3.0e12, hbm_bw_datasheet=3.35e12,
    l2_bytes=50 * 2**20, last_level_cache_bytes=50 * 2**20,
    timer_asm="mov.u64 $0, %globaltimer;",
    l2_prefetch_asm="mov.u32 $0, 0; prefetch.global.L2 [$1];",
    notes="acquire: ld.global.acquire.gpu via atomic_add(0); publish: bar.sync then red.release.gpu",
)

"""NVIDIA H200 SXM (../shared/design/FACTS.md): 132 SMs, 141 GB HBM3e, ~4.3 TB/s read measured."""
from .base import Target

H200 = Target(
    name="h200", vendor="nvidia", arch="sm_90", triton_backend="cuda", triton_arch=90,
    compute_units=132, warp_size=32,
    # 3 programs x 4 warps per SM, registers capped at 168 (3 x 128 threads x 168 = 64,512 of 65,536):
    # measured 5-7% faster than 2 programs at 255 registers on laneformer-2b (docs/performance-notes.md)
    programs_per_unit=3, num_warps=4, max_registers=168,
    hbm_bytes=141 * 10**9, hbm_read_bw=4.25e12, hbm_bw_datasheet=4.8e12,
    l2_bytes=60 * 2**20, last_level_cache_bytes=60 * 2**20,
    timer_asm="mov.u64 $0, %globaltimer;",
    l2_prefetch_asm="mov.u32 $0, 0; prefetch.global.L2 [$1];",
    # each kind's mean body (after its waits) in the sixth session's profile of laneformer-2b at context
    # 1024 (docs/results/2026-11-30-task-times-2b-1024-s6.npz); placing with them, a 1 us hop and the
    # lane groups out of phase: 1.561 / 1.552 -> 1.461 ms against the bytes model (docs/benchmarks.md,
    # seventh session)
    kind_us=(("embed", 3.0), ("matvec/rmsnorm/rope_store", 1.96), ("matvec/rmsnorm/rope_cache", 2.15),
             ("matvec/rmsnorm/cache", 2.0), ("attention", 5.48), ("matvec/attn_combine/store", 6.86),
             ("residual", 6.04), ("matvec/rmsnorm/store", 2.2), ("matvec/silu_mul/store", 2.97),
             ("matvec/attn_combine/residual", 4.56), ("matvec/silu_mul/residual", 3.07), ("final_norm", 11.65),
             ("matvec/plain/store_argmax", 2.73), ("argmax", 15.97)),
    notes="acquire: ld.global.acquire.gpu via atomic_add(0); publish: bar.sync then red.release.gpu",
)

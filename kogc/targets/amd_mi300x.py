"""AMD MI300X: 304 CUs = 8 XCDs x 38, wavefront 64, 192 GB, 5.3 TB/s datasheet."""
from .base import Target

MI300X = Target(
    name="mi300x", vendor="amd", arch="gfx942", triton_backend="hip", triton_arch="gfx942",
    compute_units=304, warp_size=64,
    programs_per_unit=1, num_warps=4,
    # no read bandwidth measured here yet: the datasheet figure stands in for it
    hbm_bytes=192 * 10**9, hbm_read_bw=5.3e12, hbm_bw_datasheet=5.3e12,
    l2_bytes=4 * 2**20, last_level_cache_bytes=256 * 2**20, dies=8,
    # an assumption (no AMD GPU measured here): a flag written back from one XCD's L2 to memory (through
    # the Infinity Cache) and read from another's costs about one more L2 round trip than within an XCD
    cross_die_hop_us=1.0,
    # every wave writes its stores back from the XCD's L2 and waits for that BEFORE the barrier that
    # precedes a counter publish: LLVM's own agent-scope release (Triton 3.6) is one wave's writeback
    # after the barrier, with no wait for it, and orders the other waves' stores only through the
    # workgroup-scope barrier. Agent scope for a flag another XCD reads; system scope for another GPU
    release_fence_asm="buffer_wbl2 sc1\n\ts_waitcnt vmcnt(0)",
    release_fence_sys_asm="buffer_wbl2 sc0 sc1\n\ts_waitcnt vmcnt(0)",
    volatile_loads=False,
    fp8_format="e4m3fnuz",
    notes="workgroup i runs on XCD i % 8; flags crossing XCDs need agent-scope release/acquire; "
          "Triton 3.6: volatile loads and tensor atomics with sem= are broken, use scalar atomics",
)

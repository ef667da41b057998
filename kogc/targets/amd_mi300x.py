"""AMD MI300X: 304 CUs = 8 XCDs x 38, wavefront 64, 192 GB, 5.3 TB/s datasheet."""
from .base import Target

MI300X = Target(
    name="mi300x", vendor="amd", arch="gfx942", triton_backend="hip", triton_arch="gfx942",
    compute_units=304, warp_size=64,
    programs_per_unit=1, num_warps=4,
    # no read bandwidth measured here yet: the datasheet figure stands in for it
    hbm_bytes=192 * 10**9, hbm_read_bw=5.3e12, hbm_bw_datasheet=5.3e12,
    l2_bytes=4 * 2**20, last_level_cache_bytes=256 * 2**20, dies=8,
    notes="workgroup i runs on XCD i % 8; flags crossing XCDs need agent-scope release/acquire; "
          "Triton 3.6: volatile loads and tensor atomics with sem= are broken, use scalar atomics",
)

"""NVIDIA H100 SXM: the H200's SM (sm_90, 132 SMs, the same register file and resident programs) with 80 GB of
HBM3, 3.35 TB/s datasheet, ~3.0 TB/s read measured, and 50 MB of L2."""
import dataclasses

from .nvidia_h200 import H200

H100 = dataclasses.replace(
    H200, name="h100",
    # read bandwidth measured on an H100 80GB HBM3 (kogc bench's 2 GiB reduction: 2.89-3.03 TB/s over ten
    # readings, 2026-12-05; kogc bench measures it again in every run, for its floor)
    hbm_bytes=80 * 10**9, hbm_read_bw=3.0e12, hbm_bw_datasheet=3.35e12,
    l2_bytes=50 * 2**20, last_level_cache_bytes=50 * 2**20,
)

"""GPU tests (skipped without one): run on the device machine; figures go to docs/benchmarks.md."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))


@pytest.mark.gpu
def test_laneformer_2b_matches_eager_fp16():
    import gpu_check
    res = gpu_check.main(["--preset", "laneformer-2b", "--steps", "256", "--timing-steps", "50"])
    assert res["max_rel_err"] < 1e-2
    assert res["argmax_agreement"] >= 0.99
    assert res["memory_ratio"] < 1.05


@pytest.mark.gpu
def test_tiny_lanes_match_eager_fp32():
    import gpu_check
    for lanes in (1, 2, 4):
        res = gpu_check.main(["--preset", "tiny", "--lanes", str(lanes), "--steps", "32", "--timing-steps", "20"])
        assert res["max_rel_err"] < 1e-4 and res["argmax_agreement"] == 1.0


@pytest.mark.gpu
def test_laneformer_2b_generate_in_one_launch():
    import gpu_generate_check
    res = gpu_generate_check.main(["--preset", "laneformer-2b", "--tokens", "256"])
    assert res["tokens"] == 256 and not res["bad"]
    assert res["generate_tok_per_s"] >= res["step_loop_tok_per_s"]


@pytest.mark.gpu
def test_pdl_back_to_back_launches_equal_the_plain_launch():
    # programmatic dependent launch lets launch i+1 start while launch i ends: after 64 one-step launches
    # back to back (no host sync between them), the KV cache every launch wrote and the last logits
    # must be the bits the default launch gives (a read before the previous launch's writes shows here)
    import dataclasses

    import torch
    from conftest import tiny

    import kogc
    from kogc.scheduler import TileConfig
    model = tiny(seed=3, num_lanes=2, dtype=torch.float16)
    kernels = [kogc.compile(model, tile_config=dataclasses.replace(TileConfig(), pdl=pdl)) for pdl in (False, True)]
    results = []
    for ck in kernels:
        for i in range(64):
            ck.launch(1 + i % 50, i)
        ck.raise_if_stuck()
        results.append((ck.buffers.KV.clone(), ck.logits_view.clone()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])

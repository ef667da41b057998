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
def test_prefetch_options_change_no_value():
    # barrier_prefetch and arrival_prefetch only ask L2 for weights: the same logits, bit for bit, over
    # steps that read each other's cache rows (the arrival flag in the table must also be stripped)
    import dataclasses

    import torch
    from conftest import tiny

    import kogc
    from kogc.scheduler import TileConfig
    model = tiny(seed=3, num_lanes=2, dtype=torch.float16)
    on = dataclasses.replace(TileConfig(), barrier_prefetch=8192, arrival_prefetch=8192)
    kernels = [kogc.compile(model), kogc.compile(model, tile_config=on)]
    for pos in range(8):
        (a, ta), (b, tb) = (ck.step(1 + pos, pos) for ck in kernels)
        assert torch.equal(a, b) and ta == tb


@pytest.mark.gpu
def test_greedy_and_filter_kernels_agree_on_the_gpu():
    # greedy_kernel (default): greedy and plain-temperature launches run a kernel without the top-k /
    # top-p code, filtered launches the kernel with it; greedy_kernel=False runs the latter for all.
    # top-k=1 at a high temperature must give the greedy tokens (the filter ran, on the device)
    import dataclasses

    import torch
    from conftest import tiny

    import kogc
    from kogc.scheduler import TileConfig
    model = tiny(seed=5, num_lanes=2, dtype=torch.float16)
    ck = kogc.compile(model)
    one = kogc.compile(model, tile_config=dataclasses.replace(TileConfig(), greedy_kernel=False))
    greedy = ck.generate([3, 4], 8)
    assert greedy == one.generate([3, 4], 8)
    assert ck.generate([3, 4], 8, temperature=50.0, seed=1, top_k=1) == greedy
    for kw in (dict(temperature=1.0, seed=1), dict(temperature=2.0, seed=2, top_p=0.5),
               dict(temperature=2.0, seed=3, top_k=3)):
        assert ck.generate([3, 4], 8, **kw) == one.generate([3, 4], 8, **kw), kw

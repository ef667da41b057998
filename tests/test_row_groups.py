"""Tiles streamed in row groups of a warp (kogc.scheduler.tasks.row_groups): the stream reordered at
packing, each row's sum inside its warp. Under the interpreter the logits equal those of the plain order
(a target without row groups) up to the sums' order; FP8 tiles: tests/test_fp8.py."""
import dataclasses

import pytest
import torch
from conftest import random_cache, rel_err, tiny

import kogc
from kogc.runtime.kernel import fill_kv_from
from kogc.scheduler import TileConfig
from kogc.scheduler.tasks import row_groups
from kogc.targets import H200, MI300X, TARGETS


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU: test_gpu)")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_tiles_in_row_groups_give_the_plain_order_logits(dtype, tol, monkeypatch):
    model = tiny(seed=9, num_lanes=2, hidden_size=512, intermediate_size=1024, dtype=dtype)
    random_cache(model, 3)
    got = {}
    for grouped in (True, False):
        monkeypatch.setitem(TARGETS, "h200", dataclasses.replace(H200, warp_row_groups=grouped))
        ck = kogc.compile(model, target="h200", tile_config=TileConfig(tile_bytes=16384))
        s = ck.schedule
        n = sum(1 for t in s.tasks if t.weight and row_groups(t.weight.rows, t.weight.cols, s.weight_esize, s.target) > 1)
        assert (n > 0) == grouped, n
        fill_kv_from(ck, model)
        got[grouped] = ck.step(7, 13)
    assert rel_err(got[True][0], got[False][0]) < tol and got[True][1] == got[False][1]


def test_which_16_bit_tiles_are_streamed_in_row_groups():
    assert row_groups(16, 1024, 2, H200) == 4 and row_groups(32, 512, 2, H200) == 4   # laneformer-0.5b's
    assert row_groups(8, 2048, 2, H200) == 1       # laneformer-2b's QKV and W1/W3: neutral in the probe
    assert row_groups(64, 256, 2, H200) == 1       # a row is one warp's loads
    assert row_groups(16, 4096, 2, H200) == 1      # 128 columns a thread
    assert row_groups(16, 1024, 2, MI300X) == 1    # not measured on AMD: rows as they are

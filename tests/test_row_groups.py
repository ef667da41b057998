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
    model = tiny(seed=9, num_lanes=2, hidden_size=512, intermediate_size=1024, num_hidden_layers=2, dtype=dtype)
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


def stream_order(rows: int, cols: int, groups: int, esize: int, target) -> torch.Tensor:
    """Where each element (row, col) of a tile goes in the stream, from the layout order_rows documents:
    thread u of group s holds rows (rows / S) s + b at columns c u + V a + j in its load A b + a, i.e. at
    V T (A b + a) + V ((T / S) s + u) + j (T threads, V elements a 16-byte load, c columns a thread)."""
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    if groups == 1:
        return (r * cols + c).reshape(-1)
    T, V = target.num_warps * target.warp_size, 16 // esize
    per_thread = cols // (T // groups)
    A = per_thread // V
    s, b = r // (rows // groups), r % (rows // groups)
    u, a, j = c // per_thread, (c % per_thread) // V, c % V
    return (V * T * (A * b + a) + V * ((T // groups) * s + u) + j).reshape(-1)


@pytest.mark.parametrize("target", [H200, MI300X])
@pytest.mark.parametrize("weights", ["model", "fp8"])
def test_packed_stream_holds_each_tile_where_its_task_reads_it(target, weights):
    # every tile, rebuilt from the model's weight (its lane, its rows; a gated pair's rows alternating) in the
    # order the layout formula gives, must stand at its task's place in its program's stream, FP8 scales after it
    from kogc.fp8 import quantize
    from kogc.frontend import to_ir
    from kogc.runtime.buffers import pack_weights
    from kogc.runtime.kernel import weights_of
    from kogc.scheduler import build_schedule
    from kogc.scheduler.tasks import stream_layout
    model = tiny(seed=3, num_lanes=2, hidden_size=1024, intermediate_size=2048, dtype=torch.float16)
    graph = to_ir(model)
    tiles = TileConfig(tile_bytes=32768 if weights == "model" else 16384, mlp_pair_inputs=32, weights=weights)
    s = build_schedule(graph, target, tile_config=tiles, num_programs=24)   # 16 x 1024 tiles: row groups on h200
    w = weights_of(model, graph, {})
    stream, offsets = pack_weights(s, w, "cpu")
    stream = stream.view(torch.uint8) if weights == "fp8" else stream
    fp8 = {k: quantize(v, s.weight_format) for k, v in w.items()} if weights == "fp8" else {}
    kinds = {"grouped": 0, "pair": 0}
    for p, q in enumerate(s.queues):
        at = int(offsets[p])
        for tid in q:
            t = s.tasks[tid].weight
            if t is None:
                continue
            names = [t.param] + ([t.up] if t.up else [])
            per = t.rows // len(names)

            def rows_of(x):      # this tile's rows of each source, alternating for a pair
                parts = [(x[n][t.lane] if t.lane >= 0 else x[n])[t.row0:t.row0 + per] for n in names]
                return torch.stack(parts, 1).reshape(t.rows, *parts[0].shape[1:])
            tile = rows_of({n: fp8[n].q.view(torch.uint8) for n in names} if fp8 else w)
            groups = row_groups(t.rows, t.cols, s.weight_esize, s.target)
            want = torch.empty(t.rows * t.cols, dtype=tile.dtype)
            want[stream_order(t.rows, t.cols, groups, s.weight_esize, s.target)] = tile.reshape(-1)
            assert torch.equal(stream[at:at + t.rows * t.cols], want), (tid, t.where)
            if fp8:
                soff, _ = stream_layout(t.rows, t.cols, 1, True)
                scales = rows_of({n: fp8[n].scale for n in names}).contiguous().view(torch.uint8)
                assert torch.equal(stream[at + soff:at + soff + 4 * t.rows], scales), (tid, t.where)
            kinds["grouped"] += groups > 1
            kinds["pair"] += bool(t.up)
            at += t.stream_elems
    assert kinds["pair"] > 0 and (kinds["grouped"] > 0) == target.warp_row_groups, kinds

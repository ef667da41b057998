"""Matvec runs (TileConfig.run_stages): a program's consecutive tasks of one matvec variant, the ones
after the first without waits, run as one loop whose tiles stream through shared memory, published
once. The runs partition each queue exactly, the kernel with runs equals eager under the interpreter,
and its sm_90 code streams them with cp.async."""
import sys

import pytest
import torch
from conftest import EXAMPLES

from kogc.frontend import decode_step, to_ir
from kogc.scheduler import SchedulerError, TileConfig, build_schedule
from kogc.scheduler.config import tile_config_from_json
from kogc.targets import H200

if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)
import llama  # noqa: E402


def test_runs_partition_each_queue():
    s = build_schedule(to_ir(decode_step(llama.kogc_model("tiny", seed=1))), H200, tile_config=TileConfig(run_stages=2),
                       num_programs=8)
    longest = 0
    for p, q in enumerate(s.queues):
        lengths = s.run_lengths[p]
        i = 0
        while i < len(q):
            n = lengths[i]
            first = s.tasks[q[i]]
            assert n >= 1 and (n == 1 or first.kind == "matvec")
            for j in range(i + 1, i + n):
                t = s.tasks[q[j]]
                # inside a run: no row of its own, the same body, no waits, the same published events
                assert lengths[j] == 0 and t.variant == first.variant and not t.waits
                if first.group in s.published:
                    assert t.group == first.group
                if first.publish_too in s.published:
                    assert t.publish_too == first.publish_too
            longest = max(longest, n)
            i += n
    assert longest > 1
    # the table carries each run's length where the kernel reads it (the header's last slot)
    table, qlen = s.table()
    assert table[:, :, s.header - 1].tolist() == [lengths + [0] * (table.shape[1] - len(lengths))
                                                  for lengths in s.run_lengths]
    with pytest.raises(SchedulerError, match="run_stages"):
        tile_config_from_json('{"run_stages": 1}')


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")
def test_runs_equal_eager():
    from test_ordinary import assert_equals_eager
    ck = assert_equals_eager(llama.kogc_model("tiny", seed=5), kernel_at=(0, 3), steps=4,
                             tile_config=TileConfig(run_stages=2, mlp_pair_inputs=0))
    assert max(n for q in ck.schedule.run_lengths for n in q) > 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")
def test_runs_across_lanes_with_fp8_equal_the_reference():
    # two lanes: a run crosses lanes (each task's residual terms are its own lane's); FP8 tiles with
    # their row scales at each tile's end of the stream
    import kogc
    from test_fp8 import _against_reference, fake_quantize, random_cache, tiny, weights_of
    model = tiny(seed=11, num_lanes=2)
    random_cache(model, 3)
    ck = kogc.compile(model, target="h200", weights="fp8", tile_config=TileConfig(run_stages=2, mlp_pair_inputs=0))
    lanes_in_a_run = set()
    for p, q in enumerate(ck.schedule.queues):
        for i, n in enumerate(ck.schedule.run_lengths[p]):
            if n > 1:
                lanes_in_a_run.add(len({ck.schedule.tasks[t].lane for t in q[i:i + n]}))
    assert max(lanes_in_a_run) > 1
    matvecs = {name for t in ck.schedule.tasks if t.weight for name in (t.weight.param, t.weight.up) if name}
    ref_w = {k: fake_quantize(v) if k in matvecs else v for k, v in weights_of(model, ck.ir).items()}
    _against_reference(model, ck, ref_w, (37,))

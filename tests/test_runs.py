"""Matvec runs: a program's consecutive tasks of a matvec variant that mostly comes in runs (those after the
first without waits, publishing to the same events) run as one loop, published once. The runs partition
each queue exactly and only the run variants form them; the kernel with runs equals eager under the
interpreter, also where a run crosses lanes (FP8 tiles)."""
import sys

import pytest
import torch
from conftest import EXAMPLES

from kogc.frontend import decode_step, to_ir
from kogc.scheduler import build_schedule
from kogc.targets import H200

if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)
import llama  # noqa: E402


def _check_runs(s):
    """Every slot belongs to exactly one run; a run's tasks after the first have no row of their own, the
    first's variant, no waits and the first's published events; runs only of the run variants."""
    longest = 0
    for p, q in enumerate(s.queues):
        lengths = s.run_lengths[p]
        i = 0
        while i < len(q):
            n = lengths[i]
            first = s.tasks[q[i]]
            assert n >= 1 and (n == 1 or (first.kind == "matvec" and first.variant in s.run_variants))
            for j in range(i + 1, i + n):
                t = s.tasks[q[j]]
                assert lengths[j] == 0 and t.variant == first.variant and not t.waits
                if first.group in s.published:
                    assert t.group == first.group
                if first.publish_too in s.published:
                    assert t.publish_too == first.publish_too
            longest = max(longest, n)
            i += n
    return longest


def test_runs_partition_each_queue_and_only_run_variants_form_them():
    s = build_schedule(to_ir(decode_step(llama.kogc_model("tiny", seed=1))), H200, num_programs=2)
    assert s.run_variants and _check_runs(s) > 1
    # a run variant's tasks come at least 2 a run on average; the others' stay one task a row
    for v in s.variants:
        runs = [n for p, q in enumerate(s.queues) for i, n in enumerate(s.run_lengths[p]) if n and s.tasks[q[i]].variant == v]
        if v in s.run_variants:
            assert sum(runs) >= 2 * len(runs)
        else:
            assert set(runs) <= {1}
    # the table carries each run's length where the kernel reads it (the header's last slot)
    table, qlen = s.table()
    assert table[:, :, s.header - 1].tolist() == [lengths + [0] * (table.shape[1] - len(lengths))
                                                  for lengths in s.run_lengths]


def test_laneformer_runs_its_lm_head_only():
    # lanes interleave in a Laneformer's queues: its layers' matvecs come one task a run, its LM head in runs
    import os

    from kogc.frontend.model_file import build_for_tracing
    s = build_schedule(to_ir(build_for_tracing(os.path.join(EXAMPLES, "laneformer.py"), preset="laneformer-0.5b")), H200)
    _check_runs(s)
    assert {v[4] for v in s.run_variants} == {"store_argmax"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")
def test_runs_equal_eager():
    from test_ordinary import assert_equals_eager
    ck = assert_equals_eager(llama.kogc_model("tiny", seed=5), kernel_at=(0, 3), steps=4)
    assert max(n for q in ck.schedule.run_lengths for n in q) > 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")
def test_runs_across_lanes_with_fp8_equal_the_reference():
    # two lanes: a run crosses lanes (each task's residual terms are its own lane's); FP8 tiles with
    # their row scales at each tile's end of the stream
    import kogc
    from test_fp8 import _against_reference, fake_quantize, random_cache, tiny, weights_of
    model = tiny(seed=11, num_lanes=2)
    random_cache(model, 3)
    ck = kogc.compile(model, target="h200", weights="fp8")
    lanes_in_a_run = set()
    for p, q in enumerate(ck.schedule.queues):
        for i, n in enumerate(ck.schedule.run_lengths[p]):
            if n > 1:
                lanes_in_a_run.add(len({ck.schedule.tasks[t].lane for t in q[i:i + n]}))
    assert max(lanes_in_a_run) > 1
    matvecs = {name for t in ck.schedule.tasks if t.weight for name in (t.weight.param, t.weight.up) if name}
    ref_w = {k: fake_quantize(v) if k in matvecs else v for k, v in weights_of(model, ck.ir).items()}
    _against_reference(model, ck, ref_w, (37,))

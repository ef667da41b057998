"""scripts/launch_gap.py and runtime.profile.launch_stamps: the time between two launches, from each
program's entry and exit stamps (rows MAXLEN, MAXLEN + 1 of PROF) and the later launch's task stamps."""
import os
import sys
import types

import numpy as np
import torch
from conftest import lf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import launch_gap  # noqa: E402

from kogc.frontend import to_ir  # noqa: E402
from kogc.runtime.profile import launch_stamps  # noqa: E402
from kogc.scheduler import build_schedule  # noqa: E402
from kogc.targets import H200  # noqa: E402


def test_gap_report_from_launch_and_task_stamps():
    # launch 7 (row MAXLEN + 1): programs leave at 100-110 us; launch 8 (row MAXLEN): they enter at
    # 115-118 us, and every task runs 1 us after the last, from 120 us
    s = build_schedule(to_ir(lf.kogc_model("tiny", device="meta", seed=None)), H200, num_programs=4)
    maxlen = max(len(q) for q in s.queues)
    prof = np.zeros((4, maxlen + 2, 3), dtype=np.int64)
    for p, q in enumerate(s.queues):
        for i, tid in enumerate(q):
            prof[p, i] = [120_000 + i * 1000, 120_000 + i * 1000 + 200, 121_000 + i * 1000]
        prof[p, maxlen + 1] = [50_000, 100_000 + p * 3_000 + (1_000 if p == 3 else 0), 7]
        prof[p, maxlen] = [115_000 + p * 1_000, 200_000, 8]
    ck = types.SimpleNamespace(buffers=types.SimpleNamespace(PROF=torch.from_numpy(prof)))
    stamps = launch_stamps(ck)
    assert sorted(stamps) == [7, 8] and stamps[8][:, 0].tolist() == [115_000, 116_000, 117_000, 118_000]
    rep = launch_gap.gap_report(s, prof, stamps)
    assert rep["epochs"] == [7, 8]
    assert rep["previous_exit_first_us"] == -10.0 and rep["previous_exit_last_us"] == 0.0
    assert (rep["entry_first_us"], rep["entry_last_us"]) == (5.0, 8.0)
    assert rep["first_task_start_us"] == 10.0 and rep["exit_last_us"] == 90.0
    embed = [i for q in s.queues for i, tid in enumerate(q) if s.tasks[tid].kind == "embed"]
    assert rep["embed_end_us"] == 11.0 + max(embed)
    assert rep["first_layer0_weight_task_start_us"] is not None


def test_launch_stamps_need_two_whole_launches():
    prof = np.zeros((2, 5, 3), dtype=np.int64)
    prof[:, 3] = [1, 2, 4]          # one launch only (epoch 4); row 4 never written
    ck = types.SimpleNamespace(buffers=types.SimpleNamespace(PROF=torch.from_numpy(prof)))
    assert list(launch_stamps(ck)) == [4]


def test_profiled_kernel_writes_each_launchs_row_by_epoch_parity():
    # under the interpreter (a target without a timer: every stamp is 0) the launch rows still carry
    # their epoch in column 2: two launches fill rows MAXLEN + epoch % 2 of every program, and no task
    # row is written there (the per-program stride is MAXLEN + 2)
    import dataclasses

    from conftest import tiny

    from kogc.api import INTERPRETER_TILES
    from kogc.runtime.kernel import CompiledKernel, weights_of
    model = tiny(seed=2, num_lanes=2)
    graph = to_ir(model)
    s = build_schedule(graph, dataclasses.replace(H200, timer_asm=""), "sequential", INTERPRETER_TILES)
    ck = CompiledKernel(graph, s, weights_of(model, graph), "cpu", interpret=True)
    maxlen = ck.buffers.TABLE.shape[1]
    ck.buffers.PROF = torch.zeros((len(s.queues), maxlen + 2, 3), dtype=torch.int64)
    ck._launch_options["PROFILE"] = 1       # what profile=True sets (refused without a timer)
    ck.launch(3, 0)
    ck.launch(4, 1)
    prof = ck.buffers.PROF.numpy()
    assert (prof[:, maxlen + 1, 2] == 1).all() and (prof[:, maxlen, 2] == 2).all()
    assert not prof[:, :maxlen].any()
    assert sorted(launch_stamps(ck)) == [1, 2]

"""A program's L2 prefetches of its own weights behind all-lane barriers (TileConfig.barrier_prefetch,
arrival_prefetch; off by default): where they point, what they compile to, what they refuse, and that
the kernel's results do not change (a prefetch changes no value; under the interpreter it is left out)."""
import dataclasses

import pytest
import torch
from conftest import tiny

import kogc
from kogc.api import INTERPRETER_TILES
from kogc.codegen.aot import compile_kernel
from kogc.codegen.render import KERNEL_NAME, render, signature
from kogc.frontend import to_ir
from kogc.scheduler import SchedulerError, TileConfig, build_schedule
from kogc.scheduler.prefetch import ARRIVE_FLAG, BARRIER_KINDS, arrival_slots, barrier_prefetch_starts
from kogc.targets import H200, MI300X

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")


def prefetches_in_ptx(graph, tmp_path, **cfg) -> int:
    """prefetch.global.L2 instructions in the sm_90 PTX of the kernel for these TileConfig fields."""
    s = build_schedule(graph, H200, tile_config=TileConfig(**cfg))
    tag = "_".join(f"{k}{v}" for k, v in cfg.items())
    (tmp_path / f"{tag}.py").write_text(render(s))
    sig, consts = signature(s)
    arts = compile_kernel(str(tmp_path / f"{tag}.py"), KERNEL_NAME, sig, consts, "h200", str(tmp_path / tag),
                          num_warps=H200.num_warps)
    return open(arts["ptx"]).read().count("prefetch.global.L2")


@pytest.mark.parametrize("option", ["barrier_prefetch", "arrival_prefetch"])
def test_compiles_to_more_l2_prefetches_refuses_what_it_cannot_and_changes_no_value(option, tmp_path):
    model = tiny(seed=9, num_lanes=2, dtype=torch.float16)
    graph = to_ir(model)
    assert prefetches_in_ptx(graph, tmp_path, **{option: 4096}) > prefetches_in_ptx(graph, tmp_path, **{option: 0})
    with pytest.raises(SchedulerError, match=f"{option}: target mi300x has no prefetch"):
        render(build_schedule(graph, MI300X, tile_config=TileConfig(**{option: 4096})))
    with pytest.raises(SchedulerError, match=f"{option} asks L2"):
        render(build_schedule(graph, H200, tile_config=TileConfig(dynamic=True, **{option: 4096})))
    plain = kogc.compile(model)
    pre = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, **{option: 4096}))
    for pos in range(2):
        (a, ta), (b, tb) = plain.step(2 + pos, pos), pre.step(2 + pos, pos)
        assert torch.equal(a, b) and ta == tb


def test_barrier_prefetch_starts_at_each_programs_first_task_behind_a_residual():
    # in its own stream; WOFF carries the starts after the stream offsets
    model = tiny(seed=9, num_lanes=2, dtype=torch.float16)
    s = build_schedule(to_ir(model), H200, tile_config=TileConfig(barrier_prefetch=4096))
    starts = barrier_prefetch_starts(s)
    residual = {t.id for t in s.tasks if t.kind == "residual"}
    assert residual, "the tiny preset has the first layer's all-lane residuals"
    for p, q in enumerate(s.queues):
        weighted = [s.tasks[i] for i in q if s.tasks[i].weight]
        first = next((k for k, t in enumerate(weighted) if residual & set(t.all_deps)), len(weighted))
        assert starts[p] == sum(t.weight.numel for t in weighted[:first])
    assert any(starts[p] < sum(s.tasks[i].weight.numel for i in q if s.tasks[i].weight)
               for p, q in enumerate(s.queues))
    ck = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, barrier_prefetch=4096))
    assert ck.buffers.WOFF.numel() == 2 * len(ck.schedule.queues) + 1


def test_arrival_prefetch_flags_the_first_task_of_each_run_behind_a_barrier():
    # in the task table's lane field: each task that waits on an all-lane task (a residual, the final
    # norm) when the task before it on its program does not
    s = build_schedule(to_ir(tiny(seed=4, num_lanes=2, dtype=torch.float16)), H200,
                       tile_config=TileConfig(arrival_prefetch=4096))
    barrier = {t.id for t in s.tasks if t.kind in BARRIER_KINDS}
    behind = [bool(barrier & set(t.all_deps)) and t.weight is not None for t in s.tasks]
    table, _ = s.table()
    runs = arrival_slots(s)
    assert sum(map(len, runs)) >= 2         # the LM head behind the final norm, the MLP behind a residual
    for p, q in enumerate(s.queues):
        want = [k for k, tid in enumerate(q) if behind[tid] and not (k and behind[q[k - 1]])]
        assert runs[p] == want
        flagged = [k for k in range(len(q)) if table[p, k, 1] >= ARRIVE_FLAG // 2]
        assert flagged == want and all(table[p, k, 1] - ARRIVE_FLAG == s.tasks[q[k]].lane for k in want)

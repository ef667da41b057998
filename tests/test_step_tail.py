"""The step's tail options (TileConfig.argmax_atomic, final_norm_2d, step_prefetch; defaults since the
tenth session) under Triton's interpreter against the kernel without them, and what they compile to."""
import dataclasses
import re

import pytest
import torch
from conftest import tiny

import kogc
from kogc.api import INTERPRETER_TILES
from kogc.scheduler import SchedulerError, TileConfig

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")

TAIL = dict(argmax_atomic=True, final_norm_2d=True, step_prefetch=4096)
OFF = dict(argmax_atomic=False, final_norm_2d=False, step_prefetch=0)     # the kernel before them


@pytest.mark.parametrize("lanes,dtype", [(2, torch.float16), (4, torch.float32), (1, torch.float16)])
def test_tail_options_equal_the_kernel_without_them(lanes, dtype):
    # greedy steps, a generation in one launch (the token key is cleared for the next step) and sampling
    # (the key orders the sampling keys): the same logits and tokens as the kernel without the options
    model = tiny(seed=17 + lanes, num_lanes=lanes, dtype=dtype)
    plain = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, **OFF))
    tail = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, **TAIL))
    for pos in range(3):
        (a, ta), (b, tb) = plain.step(5 + pos, pos), tail.step(5 + pos, pos)
        assert torch.equal(a, b) and ta == tb, f"pos {pos}"
    assert tail.generate([1, 2], 5) == plain.generate([1, 2], 5)
    assert tail.generate([3], 4, temperature=1.0, seed=11) == plain.generate([3], 4, temperature=1.0, seed=11)


def test_token_key_breaks_ties_to_the_lowest_row():
    # two rows of the LM head equal and the largest logit, in different tasks: like torch.argmax, the
    # lower row wins (the key's low bits; an atomic max does not depend on which task comes first)
    model = tiny(seed=23, num_lanes=2)
    tiles = dataclasses.replace(INTERPRETER_TILES, argmax_atomic=True, tile_bytes=4096)   # 16 rows a task
    ck = kogc.compile(model, tile_config=tiles)
    _, top = ck.step(4, 0)
    rows = next(t.weight.rows for t in ck.schedule.tasks if t.variant[:1] == ("matvec",) and t.variant[4] == "store_argmax")
    twin = top + rows if top + rows < model.config.vocab_size else top - rows      # a row of another task
    with torch.no_grad():
        model.lm_head.weight[twin] = model.lm_head.weight[top]
    ck = kogc.compile(model, tile_config=tiles)
    logits, tok = ck.step(4, 0)
    assert logits[top] == logits[twin] == logits.max()
    assert tok == min(top, twin) == int(torch.argmax(logits))


def test_step_prefetch_compiles_to_l2_prefetches_and_refuses_what_it_cannot_do(tmp_path):
    from kogc.codegen.aot import compile_kernel
    from kogc.codegen.render import KERNEL_NAME, render, signature
    from kogc.frontend import to_ir
    from kogc.scheduler import build_schedule
    from kogc.targets import H200, MI300X
    graph = to_ir(tiny(num_lanes=2, dtype=torch.float16))
    counts = {}
    for nbytes in (0, 8192):
        s = build_schedule(graph, H200, tile_config=TileConfig(step_prefetch=nbytes, argmax_atomic=True))
        (tmp_path / f"{nbytes}.py").write_text(render(s))
        sig, consts = signature(s)
        arts = compile_kernel(str(tmp_path / f"{nbytes}.py"), KERNEL_NAME, sig, consts, "h200",
                              str(tmp_path / f"sm_90_{nbytes}"), num_warps=H200.num_warps)
        ptx = open(arts["ptx"]).read()
        counts[nbytes] = ptx.count("prefetch.global.L2")
        assert re.search(r"atom\.[a-z.]*max\.s64", ptx)      # the LM head's token key
    assert counts[0] == 0 and counts[8192] > 0
    with pytest.raises(SchedulerError, match="step_prefetch: target mi300x has no prefetch"):
        render(build_schedule(graph, MI300X, tile_config=TileConfig(step_prefetch=8192)))
    with pytest.raises(SchedulerError, match="step_prefetch must be a power of two"):
        render(build_schedule(graph, H200, tile_config=TileConfig(step_prefetch=1000)))
    with pytest.raises(SchedulerError, match="dynamic placement"):
        render(build_schedule(graph, H200, tile_config=TileConfig(step_prefetch=8192, dynamic=True)))


@pytest.mark.parametrize("parts", [2, 4])
def test_final_norm_split_equals_one_task(parts):
    # the final norm as `parts` tasks, each writing its columns of x: the same logits and tokens, the
    # LM head waiting on all of them (a per-lane scale too: each part takes its columns of every row)
    model = tiny(seed=29, num_lanes=2, dtype=torch.float16, replicated_rmsn_scale=False)
    one = kogc.compile(model, tile_config=INTERPRETER_TILES)
    split = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, final_norm_split=parts))
    assert sum(t.kind == "final_norm" for t in split.schedule.tasks) == parts
    for pos in range(3):
        (a, ta), (b, tb) = one.step(6 + pos, pos), split.step(6 + pos, pos)
        assert torch.equal(a, b) and ta == tb, f"pos {pos}"
    assert split.generate([1, 2], 4) == one.generate([1, 2], 4)


def test_final_norm_split_refuses_what_it_cannot_do():
    from kogc.codegen.render import render
    from kogc.frontend import to_ir
    from kogc.scheduler import build_schedule
    from kogc.targets import H200
    graph = to_ir(tiny(num_lanes=2))
    for cfg, msg in [(TileConfig(final_norm_split=2, final_norm_2d=False), "needs final_norm_2d"),
                     (TileConfig(final_norm_split=3), "power of two"),
                     (TileConfig(final_norm_split=64), ">= 16 columns")]:
        with pytest.raises(SchedulerError, match=msg):
            render(build_schedule(graph, H200, tile_config=cfg))


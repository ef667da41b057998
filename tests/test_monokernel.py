"""The generated persistent kernel, run end to end under Triton's interpreter (CPU), against the IR
reference executor and the eager model; the runtime's errors; ahead-of-time compilation."""
import pytest
import torch
from conftest import MODEL_FILE, rel_err, tiny

import kogc
from kogc.cli import main
from kogc.errors import KogcError
from kogc.ir import execute, new_state
from kogc.runtime import KernelHangError

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")


def run_against_references(model, steps, seed):
    ck = kogc.compile(model, target="h200")
    assert ck.interpret and len(ck.schedule.queues) == 1
    weights = dict(model.named_parameters())
    state = new_state(ck.ir)
    gen = torch.Generator().manual_seed(seed)
    for pos in range(steps):
        tok = int(torch.randint(0, model.config.vocab_size, (), generator=gen))
        logits, nxt = ck.step(tok, pos)
        (ir_logits, ir_nxt), _ = execute(ck.ir, weights, state, [tok, pos])
        eager_logits, eager_nxt = model(torch.tensor(tok), torch.tensor(pos))
        yield pos, logits, nxt, ir_logits, int(ir_nxt), eager_logits, int(eager_nxt)


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_kernel_equals_ir_and_eager_fp32_16_steps(lanes):
    model = tiny(seed=100 + lanes, num_lanes=lanes, replicated_rmsn_scale=lanes != 2)
    for pos, logits, nxt, ir, ir_nxt, eager, eager_nxt in run_against_references(model, 16, seed=lanes):
        assert rel_err(logits, ir) < 1e-5, f"pos {pos}"
        assert rel_err(logits, eager) < 1e-5, f"pos {pos}"
        assert nxt == ir_nxt == eager_nxt


@pytest.mark.parametrize("lanes,ffn,dtype", [(2, 96, torch.float32), (1, 100, torch.float32),
                                              (2, 160, torch.float16)])
def test_ffn_width_not_a_power_of_two(lanes, ffn, dtype):
    # e.g. Llama-3-8B's 14336 over 8 lanes is 1792 per lane: W2's input is held in the next power
    # of two of lanes, the rest masked (K = 48, 100, 80 here)
    model = tiny(seed=31, num_lanes=lanes, intermediate_size=ffn, dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for pos, logits, nxt, ir, ir_nxt, eager, eager_nxt in run_against_references(model, 4, seed=5):
        assert rel_err(logits, ir) < tol and rel_err(logits, eager) < tol, f"pos {pos}"
        assert nxt == ir_nxt


def test_kernel_fp16_close_to_eager():
    model = tiny(seed=7, num_lanes=2, broadcast_delay=2, dtype=torch.float16)
    agree = 0
    for pos, logits, nxt, ir, ir_nxt, eager, eager_nxt in run_against_references(model, 16, seed=9):
        assert logits.dtype == torch.float16
        assert rel_err(logits, eager) < 1e-2, f"pos {pos}"
        assert nxt == int(torch.argmax(logits))          # the kernel's own argmax is exact on its logits
        agree += nxt == eager_nxt
    assert agree >= 15


def test_kernel_comm_variants():
    for flags in (dict(use_comm=False), dict(use_early_comm=False)):
        model = tiny(seed=11, num_lanes=2, **flags)
        for pos, logits, nxt, ir, ir_nxt, eager, eager_nxt in run_against_references(model, 3, seed=1):
            assert rel_err(logits, eager) < 1e-5


def test_bad_inputs_are_refused_before_launch():
    ck = kogc.compile(tiny(num_lanes=2))
    with pytest.raises(KogcError, match="outside the vocabulary"):
        ck.step(10_000, 0)
    with pytest.raises(KogcError, match="outside the KV cache"):
        ck.step(1, ck.max_pos)
    assert ck.epoch == 0


@pytest.mark.parametrize("parallel_waits,header_ahead,which", [(False, False, 1), (True, False, 1),
                                                              (False, True, 0), (False, True, 1)])
def test_watchdog_names_the_stuck_task(parallel_waits, header_ahead, which):
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    ck = kogc.compile(tiny(num_lanes=2), tile_config=dataclasses.replace(
        INTERPRETER_TILES, parallel_waits=parallel_waits, header_ahead=header_ahead))
    # make one wait impossible at run time (the compile-time check cannot see a tampered table): the
    # second wait of a task with several (with parallel waits: all acquired at once), or the first
    # (with header_ahead: read with the number of waits, before the loop over the others)
    table = ck.buffers.TABLE
    slot = next(i for i in range(table.shape[1]) if table[0, i, 3] > 1)
    from kogc.scheduler.schedule import HEADER
    from kogc.scheduler.tasks import NARGS
    table[0, slot, HEADER + NARGS + 2 * which + 1] = 1_000_000
    ck.watchdog_spins = 50
    tid = ck.schedule.queues[0][slot]
    with pytest.raises(KernelHangError, match=f"task {tid} .*counter .*needed 1000000"):
        ck.step(1, 0)


class _NoIteration(list):
    def __iter__(self):
        raise AssertionError("launch walked the task list")


def test_launch_does_no_per_task_host_work():
    # a step loop launches once per token: a walk over the 127k tasks of laneformer-2b there once
    # cost 10 ms of host time per launch (5x the step itself); the launch must use precomputed values
    ck = kogc.compile(tiny(num_lanes=2))
    ck.step(1, 0)
    ck.schedule.tasks = _NoIteration(ck.schedule.tasks)
    ck.schedule.queues = _NoIteration(ck.schedule.queues)
    ck.launch(2, 1)
    ck.launch(3, 2, nsteps=2)


def test_kernel_text_does_not_grow_with_layers():
    from kogc.frontend import to_ir
    from kogc.codegen.render import render
    from kogc.scheduler import build_schedule
    from kogc.targets import H200
    import laneformer as lf
    sources = []
    for layers in (2, 6):
        g = to_ir(lf.kogc_model("tiny", device="meta", seed=None, num_hidden_layers=layers))
        sources.append(render(build_schedule(g, H200, check=False)))
    assert sources[0].splitlines()[2:] == sources[1].splitlines()[2:]   # only the header comment differs


@pytest.mark.parametrize("target,binary,magic", [("h200", "sm_90/kogc_monokernel.cubin", b"\x7fELF"),
                                                 ("mi300x", "gfx942/kogc_monokernel.hsaco", b"\x7fELF")])
def test_aot_compile_for_both_targets(tmp_path, capsys, target, binary, magic):
    code = main(["compile", MODEL_FILE, "--target", target, "--config", "tiny", "--out", str(tmp_path)])
    assert code == 0
    data = (tmp_path / binary).read_bytes()
    assert data[:4] == magic and len(data) > 10_000
    for name in ("kernel.py", "schedule.json", "report.txt", "ir.txt"):
        assert (tmp_path / name).stat().st_size > 0
    assert "tasks" in (tmp_path / "report.txt").read_text()


def test_aot_ffn_width_not_a_power_of_two(tmp_path):
    # the masked matvec compiles for sm_90 with loads as wide as the power-of-two kernel's
    # (3584 / 2 lanes = 1792, as Llama-3-8B's 14336 over 8 lanes)
    from kogc.codegen.aot import compile_kernel, disassembly_summary
    from kogc.codegen.render import KERNEL_NAME, render, signature
    from kogc.frontend import to_ir
    from kogc.scheduler import build_schedule
    from kogc.targets import H200
    widths, spills = {}, {}
    for ffn in (4096, 3584):
        model = tiny(num_lanes=2, hidden_size=512, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=ffn, dtype=torch.float16)
        s = build_schedule(to_ir(model), H200)
        masked = [v for v in s.variants if v[0] == "matvec" and len(v) > 9]
        assert (ffn == 3584) == bool(masked) and all(v[2] == 1792 and v[9] == 2048 for v in masked)
        (tmp_path / f"{ffn}.py").write_text(render(s))
        sig, consts = signature(s)
        arts = compile_kernel(str(tmp_path / f"{ffn}.py"), KERNEL_NAME, sig, consts, "h200",
                              str(tmp_path / f"sm_90_{ffn}"), num_warps=H200.num_warps)
        summary = disassembly_summary(arts)
        spills[ffn] = summary["spill_store_bytes"]
        widths[ffn] = summary["ld_global_bits"]
    assert widths[3584] == widths[4096] and widths[3584][128] > 0
    assert spills[3584] == spills[4096]           # the masked rows cost no registers


def test_aot_attention_loads_are_wide(tmp_path):
    # K/V rows must load 16 bytes at a time: with 16-bit loads (a lost alignment hint) the count of
    # scalar loads grows with the attention block; with wide loads it does not
    from kogc.codegen.aot import compile_kernel, disassembly_summary
    from kogc.codegen.render import KERNEL_NAME, render, signature
    from kogc.frontend import to_ir
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.targets import H200
    model = tiny(num_lanes=2, hidden_size=512, num_attention_heads=4, num_key_value_heads=2, dtype=torch.float16)
    graph = to_ir(model)
    bits = {}
    for block in (16, 64):
        s = build_schedule(graph, H200, tile_config=TileConfig(attn_impl="dot", attn_block=block))
        (tmp_path / f"{block}.py").write_text(render(s))
        sig, consts = signature(s)
        arts = compile_kernel(str(tmp_path / f"{block}.py"), KERNEL_NAME, sig, consts, "h200",
                              str(tmp_path / f"sm_90_{block}"), num_warps=H200.num_warps)
        bits[block] = disassembly_summary(arts)["ld_global_bits"]
    assert bits[64].get(16, 0) == bits[16].get(16, 0)          # no scalar load per cache element
    assert bits[64][128] > bits[16][128]                       # the bigger block is more wide loads


def test_l2_prefetch_option(tmp_path):
    # opt-in: each matvec asks L2 for the next bytes of its program's weight stream; off, the code is
    # unchanged; a target without the instruction, or the interpreter, refuses it by name
    from kogc.codegen.aot import compile_kernel
    from kogc.codegen.render import KERNEL_NAME, render, signature
    from kogc.frontend import to_ir
    from kogc.scheduler import SchedulerError, TileConfig, build_schedule
    from kogc.targets import H200, MI300X
    model = tiny(num_lanes=2, hidden_size=256, dtype=torch.float16)
    graph = to_ir(model)
    counts = {}
    # (read_ahead and step_prefetch off: the table-row and step-end prefetches are the same
    # instruction); attn_prefetch: attention asks L2 for its cache rows before its wait
    for name, opts in {"off": {}, "weights": {"l2_prefetch": 32768}, "attention": {"attn_prefetch": True}}.items():
        s = build_schedule(graph, H200, tile_config=TileConfig(read_ahead=False, step_prefetch=0, **opts))
        (tmp_path / f"{name}.py").write_text(render(s))
        sig, consts = signature(s)
        arts = compile_kernel(str(tmp_path / f"{name}.py"), KERNEL_NAME, sig, consts, "h200",
                              str(tmp_path / f"sm_90_{name}"), num_warps=H200.num_warps)
        counts[name] = open(arts["ptx"]).read().count("prefetch.global.L2")
    assert counts["off"] == 0 and counts["weights"] > 0 and counts["attention"] > 0
    with pytest.raises(SchedulerError, match="mi300x has no prefetch"):
        render(build_schedule(graph, MI300X, tile_config=TileConfig(l2_prefetch=32768)))
    with pytest.raises(SchedulerError, match="attn_prefetch: target mi300x"):
        render(build_schedule(graph, MI300X, tile_config=TileConfig(attn_prefetch=True)))
    with pytest.raises(SchedulerError, match="attn_pipeline and attn_preload"):
        render(build_schedule(graph, H200, tile_config=TileConfig(attn_pipeline=True, attn_preload=True)))
    with pytest.raises(SchedulerError, match="power of two"):
        render(build_schedule(graph, H200, tile_config=TileConfig(l2_prefetch=1000)))
    with pytest.raises(SchedulerError, match="parallel_waits .* mi300x"):
        render(build_schedule(graph, MI300X, tile_config=TileConfig(parallel_waits=True)))
    with pytest.raises(KogcError, match="interpreter"):
        kogc.compile(model, tile_config=TileConfig(l2_prefetch=32768))


@pytest.mark.parametrize("stage,needle", [("tasks", "matvec/"), ("schedule", "programs"),
                                          ("source", "@triton.jit")])
def test_cli_emits_stages(capsys, stage, needle):
    assert main(["compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--emit", stage]) == 0
    assert needle in capsys.readouterr().out


def test_cli_tile_config(capsys):
    # --tile-config reaches the scheduler; bad JSON, unknown fields and refused settings exit 2 by name
    assert main(["compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--emit", "tasks",
                 "--tile-config", '{"attn_splits": 4}']) == 0
    out = capsys.readouterr().out
    g, hd, splits = out.split(" attention/")[1].split()[0].split("/")[:3]      # the variant's fields
    assert splits == "4"
    for bad, needle in (("{nope", "not JSON"), ('{"attn_split": 4}', "unknown field(s) attn_split"),
                        ('[1]', "JSON object"), ('{"attn_impl": "fast"}', "unknown attention implementation"),
                        ('{"attn_pv": "fp8"}', "unknown attn_pv")):
        assert main(["compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--emit", "tasks",
                     "--tile-config", bad]) == 2
        assert needle in capsys.readouterr().err


def test_attention_with_tl_dot_equals_reference():
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    model = tiny(seed=21, num_lanes=2, hidden_size=128)          # head_dim 16: tl.dot needs >= 16
    ck = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, attn_impl="dot"))
    assert any(v[0] == "attention" and v[-1] == "dot" for v in ck.schedule.variants)
    weights, state = dict(model.named_parameters()), new_state(ck.ir)
    for pos in range(3):
        logits, nxt = ck.step(5 + pos, pos)
        (ref, ref_nxt), _ = execute(ck.ir, weights, state, [5 + pos, pos])
        assert rel_err(logits, ref) < 1e-5 and nxt == int(ref_nxt)


@pytest.mark.parametrize("impl,dtype", [("reduce", torch.float32), ("dot", torch.float16)])
def test_read_ahead_and_attention_preload_equal_reference(impl, dtype):
    # the table read one task ahead (with rows padded to whole lines), and attention's first block of
    # cache rows loaded before its wait (all rows but this step's): over enough steps that a split spans
    # several blocks, with the row `pos` both inside and outside the preloaded block; and with both off
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    model = tiny(seed=41, num_lanes=2, hidden_size=128, dtype=dtype)          # head_dim 16
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    pvs = ("ieee", "fp16") if impl == "dot" else ("ieee",)
    cases = [(True, True, "ieee", False), (False, False, "ieee", False)] + [(False, True, pv, False) for pv in pvs]
    cases += [(False, False, pv, True) for pv in pvs]      # attn_pipeline: block i+1 loaded during block i
    for ahead, preload, pv, pipeline in cases:
        cfg = dataclasses.replace(INTERPRETER_TILES, attn_impl=impl, attn_splits=1, attn_block=16,
                                  read_ahead=ahead, attn_preload=preload, attn_pv=pv, attn_pipeline=pipeline,
                                  align_rows=ahead)
        ck = kogc.compile(model, tile_config=cfg)
        assert ck.schedule.row_width % 32 == 0 or not ahead
        assert ("kt0" in ck.source) == preload           # the preload is in the kernel text or not
        assert ("kn = tl.load" in ck.source) == pipeline
        weights, state = dict(model.named_parameters()), new_state(ck.ir)
        for pos in range(40):                          # 40 positions: blocks of 16 -> 3 per split
            logits, nxt = ck.step(3 + pos % 7, pos)
            (ref, ref_nxt), _ = execute(ck.ir, weights, state, [3 + pos % 7, pos])
            assert rel_err(logits, ref) < tol, f"read_ahead {ahead}, preload {preload}, attn_pv {pv}, " \
                                               f"pipeline {pipeline}, pos {pos}"


def test_parallel_waits_compile_to_plain_acquire_loads(tmp_path):
    # the tensor of waits is polled with one `ld.global.acquire.gpu` per element (inline asm): a tensor
    # tl.atomic_add(0) would stay a read-modify-write (serialised at L2 under hundreds of pollers)
    from kogc.codegen.aot import compile_kernel
    from kogc.codegen.render import KERNEL_NAME, render, signature
    from kogc.frontend import to_ir
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.targets import H200
    s = build_schedule(to_ir(tiny(num_lanes=2, hidden_size=256, dtype=torch.float16)), H200,
                       tile_config=TileConfig(parallel_waits=True))
    assert s.max_waits > 1
    (tmp_path / "k.py").write_text(render(s))
    sig, consts = signature(s)
    arts = compile_kernel(str(tmp_path / "k.py"), KERNEL_NAME, sig, consts, "h200", str(tmp_path / "sm_90"),
                          num_warps=H200.num_warps)
    ptx = open(arts["ptx"]).read()
    assert "ld.global.acquire.gpu.b32" in ptx and "atom.global.gpu.acquire" not in ptx


@pytest.mark.parametrize("pv", ["tf32x3", "fp16"])
def test_attention_pv_precision_options(pv):
    # probabilities x V on tensor cores (tf32x3, about fp32) or in fp16: the same model within fp16 noise
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    model = tiny(seed=43, num_lanes=2, hidden_size=128, dtype=torch.float16)          # head_dim 16
    ck = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, attn_impl="dot", attn_pv=pv))
    assert any(v[0] == "attention" and v[-1] == f"dot-{pv}" for v in ck.schedule.variants)
    assert f'PV="{pv}"' in ck.source
    weights, state = dict(model.named_parameters()), new_state(ck.ir)
    for pos in range(6):
        logits, nxt = ck.step(3 + pos, pos)
        (ref, ref_nxt), _ = execute(ck.ir, weights, state, [3 + pos, pos])
        assert rel_err(logits, ref) < 1e-2, f"pos {pos}"


@pytest.mark.parametrize("lanes,merge", [(2, True), (4, True), (2, False)])
def test_merged_events_kernel_equals_reference(lanes, merge):
    # merge_events is the default; the unmerged kernel (one counter per fused op and lane) still works
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    model = tiny(seed=51 + lanes, num_lanes=lanes)
    ck = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, merge_events=merge))
    assert any("+" in e.name for e in ck.schedule.events) == merge
    steps_and_generation_match(model, ck, steps=8)


@pytest.mark.parametrize("lanes,dtype", [(1, torch.float32), (2, torch.float16), (4, torch.float32)])
def test_header_ahead_equals_reference(lanes, dtype):
    # the publish's event id read with the variant, the first wait's event with the number of waits
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    model = tiny(seed=61 + lanes, num_lanes=lanes, dtype=dtype)
    ck = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, header_ahead=True))
    before = dataclasses.replace(INTERPRETER_TILES, header_ahead=False)
    assert "ev0 = tl.load" in ck.source and "ev0 = tl.load" not in kogc.compile(model, tile_config=before).source
    if dtype == torch.float32:
        steps_and_generation_match(model, ck, steps=8)
    else:   # fp16: bit-equal to the kernel without it (same arithmetic, only the table reads move)
        plain = kogc.compile(model, tile_config=before)
        for pos in range(6):
            assert torch.equal(ck.step(2 + pos, pos)[0], plain.step(2 + pos, pos)[0]), f"pos {pos}"


def steps_and_generation_match(model, ck, steps):
    """`steps` single steps equal the IR reference; several steps in one launch (the step boundary
    too) give the same tokens as the default kernel."""
    from kogc.api import INTERPRETER_TILES
    weights, state = dict(model.named_parameters()), new_state(ck.ir)
    for pos in range(steps):
        logits, nxt = ck.step(2 + pos, pos)
        (ref, ref_nxt), _ = execute(ck.ir, weights, state, [2 + pos, pos])
        assert rel_err(logits, ref) < 1e-5 and nxt == int(ref_nxt), f"pos {pos}"
    plain = kogc.compile(model, tile_config=INTERPRETER_TILES)
    assert ck.generate([5, 6], 6) == plain.generate([5, 6], 6)


@pytest.mark.parametrize("lanes", [1, 2])
def test_dynamic_placement_equals_reference(lanes):
    # one task list, programs taking tasks by atomic ticket (here 3 programs under the interpreter:
    # the first takes every task in order, the others find the list empty); steps and a generation
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    model = tiny(seed=61 + lanes, num_lanes=lanes)
    ck = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, dynamic=True, merge_events=True),
                      num_programs=3)
    assert ck.schedule.num_programs == 3 and len(ck.schedule.queues) == 1 and "ticket" in ck.schedule.report()
    steps_and_generation_match(model, ck, steps=6)


def test_dynamic_placement_refuses_per_queue_options():
    from kogc.codegen.render import render
    from kogc.frontend import to_ir
    from kogc.scheduler import SchedulerError, TileConfig, build_schedule
    from kogc.targets import H200
    s = build_schedule(to_ir(tiny(num_lanes=2)), H200, tile_config=TileConfig(dynamic=True, read_ahead=True),
                       num_programs=4)
    with pytest.raises(SchedulerError, match="dynamic placement .* read_ahead"):
        render(s)


@pytest.mark.parametrize("lanes", [1, 2])
def test_attention_last_split_combines(lanes):
    # attn_last_combines: the last split of each (lane, KV head) to arrive (a monotonic arrival counter,
    # NS per step) combines the partials into o, and Wo reads o with a plain prologue. Single steps
    # and several steps in one launch (the counter across epochs) equal the reference and the default
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.scheduler.check import check_schedule
    from kogc.targets import H200
    model = tiny(seed=61 + lanes, num_lanes=lanes, hidden_size=128)
    cfg = dataclasses.replace(INTERPRETER_TILES, attn_last_combines=True, attn_splits=4)
    ck = kogc.compile(model, tile_config=cfg)
    kinds = {t.kind_key for t in ck.schedule.tasks}
    assert not any("attn_combine" in k for k in kinds) and "ARRIVE" in ck.source
    steps_and_generation_match(model, ck, steps=8)
    s = build_schedule(ck.ir, H200, "parallel", TileConfig(attn_last_combines=True), num_programs=8)
    check_schedule(s.tasks, s.events, s.queues)
    o_writers = [t for t in s.tasks if t.kind == "attention" and any(r.arena == "act" for r in t.writes)]
    assert len(o_writers) == sum(t.kind == "attention" for t in s.tasks)      # every split may be the last


@pytest.mark.parametrize("lanes,dtype", [(1, None), (2, None), (2, torch.float16)])
def test_flagged_activations_equal_the_default(lanes, dtype):
    # ll_act: activations as (data, epoch) words polled by their readers, no counter for them. Single
    # steps and a generation (epochs across steps in one launch) equal the reference and, bit for bit,
    # the default kernel; only the producers someone still acquires publish
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    model = tiny(seed=71 + lanes, num_lanes=lanes, dtype=dtype)
    ck = kogc.compile(model, tile_config=dataclasses.replace(INTERPRETER_TILES, ll_act=True))
    plain = kogc.compile(model, tile_config=INTERPRETER_TILES)
    assert ck.buffers.ACT.dtype == torch.int64 and "_ll_write" in ck.source and "_ll_write" not in plain.source
    assert len(ck.schedule.published) < len(ck.schedule.events)
    for pos in range(3):
        a, ta = ck.step(3 + pos, pos)
        b, tb = plain.step(3 + pos, pos)
        assert torch.equal(a, b) and ta == tb, f"pos {pos}"
    assert ck.generate([5, 6], 5, temperature=0.8, seed=3) == plain.generate([5, 6], 5, temperature=0.8, seed=3)


def test_flagged_read_that_can_never_be_satisfied_is_reported():
    # point the first normed matvec's input at the final norm's output, which a task later in the same
    # (only) queue writes: the poll can never see this step's epoch; the watchdog names the task and
    # the value it waited for
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    from kogc.scheduler.schedule import HEADER
    from kogc.scheduler.tasks import A_X
    ck = kogc.compile(tiny(num_lanes=1), tile_config=dataclasses.replace(INTERPRETER_TILES, ll_act=True))
    tasks, queue = ck.schedule.tasks, ck.schedule.queues[0]
    slot = next(i for i, tid in enumerate(queue) if tasks[tid].kind_key.startswith("matvec/rmsnorm"))
    final = next(t for t in tasks if t.kind == "final_norm")
    name = next(n for n, (arena, off, _, _) in ck.schedule.layout.slots.items()
                if arena == "act" and off == final.writes[0].start)
    ck.buffers.TABLE[0, slot, HEADER + A_X] = final.writes[0].start
    ck.watchdog_spins = 50
    with pytest.raises(KernelHangError, match=f"task {queue[slot]} .*read activation element .*of {name}.*needed 1"):
        ck.step(1, 0)


def test_cache_hints_mark_the_streams():
    # cache_hints (default): the weight stream evict_first, the task table evict_last; kv_evict_first
    # (default) adds attention's cache reads; without them no hint is rendered (the measured kernels' text)
    from kogc.codegen.render import render
    from kogc.frontend import to_ir
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.targets import H200
    ir = to_ir(tiny(num_lanes=2))

    def src(**kw):
        return render(build_schedule(ir, H200, tile_config=TileConfig(**kw), num_programs=8))
    on, off, no_kv = src(), src(cache_hints=False, kv_evict_first=False), src(kv_evict_first=False)
    assert "tl.load(W + w_idx, eviction_policy=\"evict_first\")" in on
    assert "n = tl.load(row + 3, eviction_policy=\"evict_last\")" in on
    assert "eviction_policy" not in off
    assert "tl.load(KV" in on and all("evict_first" in line for line in on.splitlines() if "tl.load(KV" in line)
    assert not any("evict" in line for line in no_kv.splitlines() if "tl.load(KV" in line)


def test_aot_vector_bodies_load_wide(tmp_path):
    # the whole-vector bodies (embed, residual, final norm, argmax) load whole vectors: without their
    # alignment hints (VALIGN) each thread loaded its share 16 bits at a time, so the scalar loads
    # grew with the hidden size (laneformer-2b's kernel had 534); with them they do not
    from kogc.codegen.aot import compile_kernel, disassembly_summary
    from kogc.codegen.render import KERNEL_NAME, render, signature
    from kogc.frontend import to_ir
    from kogc.scheduler import build_schedule
    from kogc.targets import H200
    bits = {}
    for d in (512, 1024):
        model = tiny(num_lanes=2, hidden_size=d, num_attention_heads=4, num_key_value_heads=2, dtype=torch.float16)
        s = build_schedule(to_ir(model), H200)
        (tmp_path / f"{d}.py").write_text(render(s))
        sig, consts = signature(s)
        arts = compile_kernel(str(tmp_path / f"{d}.py"), KERNEL_NAME, sig, consts, "h200",
                              str(tmp_path / f"sm_90_{d}"), num_warps=H200.num_warps)
        bits[d] = disassembly_summary(arts)["ld_global_bits"]
    assert bits[1024].get(16, 0) <= bits[512].get(16, 0)       # no scalar load per vector element
    assert bits[1024][128] > 0


@pytest.mark.parametrize("overrides", [dict(num_lanes=2, hidden_size=256, dtype=torch.float16),
                                       dict(num_lanes=1, hidden_size=128, intermediate_size=100),
                                       dict(num_lanes=4, hidden_size=64)])
def test_vector_alignment_divides_every_vector_region(overrides):
    # the whole-vector bodies (embed, residual, final norm, argmax) are hinted as starting at
    # multiples of vector_alignment (wide loads on the GPU; a wrong hint would be misaligned loads
    # there, which the interpreter cannot show): check the claim against the regions those tasks
    # touch, an independent account of their addresses (derived from the layout, not the arguments)
    from kogc.codegen.render import VECTOR_KINDS, vector_alignment
    from kogc.frontend import to_ir
    from kogc.scheduler import build_schedule
    from kogc.targets import H200
    s = build_schedule(to_ir(tiny(**overrides)), H200)
    a = vector_alignment(s)
    assert a & (a - 1) == 0
    for t in s.tasks:
        if t.kind in VECTOR_KINDS:
            for r in t.reads + t.writes:
                if r.arena in ("act", "f32", "small"):
                    assert r.start % a == 0, (t.kind, r)
    if overrides.get("hidden_size") == 256:
        assert a >= 4          # (here the argmax's 4 partial maxima set it; laneformer-2b gets 16)


def test_wide_combine_equals_plain_and_loads_wide(tmp_path):
    # wide_combine: Wo's combine of the attention splits loads the partials with an alignment hint.
    # Under the interpreter (no hints there) bit-equal to the kernel without it; compiled for sm_90,
    # fewer 32-bit loads and more 128-bit ones
    import dataclasses
    from kogc.api import INTERPRETER_TILES
    from kogc.codegen.aot import compile_kernel, disassembly_summary
    from kogc.codegen.render import KERNEL_NAME, render, signature
    from kogc.frontend import to_ir
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.targets import H200
    model = tiny(seed=91, num_lanes=2, dtype=torch.float16)
    cfg = dataclasses.replace(INTERPRETER_TILES, attn_splits=2)
    ck = kogc.compile(model, tile_config=dataclasses.replace(cfg, wide_combine=True))
    plain = kogc.compile(model, tile_config=cfg)
    for pos in range(4):
        assert torch.equal(ck.step(2 + pos, pos)[0], plain.step(2 + pos, pos)[0]), f"pos {pos}"
    graph = to_ir(tiny(num_lanes=2, hidden_size=512, num_attention_heads=4, num_key_value_heads=2,
                       dtype=torch.float16))
    bits = {}
    for wide in (False, True):
        s = build_schedule(graph, H200, tile_config=TileConfig(wide_combine=wide))
        (tmp_path / f"{wide}.py").write_text(render(s))
        sig, consts = signature(s)
        arts = compile_kernel(str(tmp_path / f"{wide}.py"), KERNEL_NAME, sig, consts, "h200",
                              str(tmp_path / f"sm_90_{wide}"), num_warps=H200.num_warps)
        bits[wide] = disassembly_summary(arts)["ld_global_bits"]
    assert bits[True][32] < bits[False][32] and bits[True][128] > bits[False][128]

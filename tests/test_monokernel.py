"""The generated persistent kernel, run end to end under Triton's interpreter (CPU), against the IR
reference executor and the eager model; the runtime's errors; what the kernel text holds.

Interpreter steps are the suite's cost (a few seconds each): each test runs few steps, at positions
chosen to matter (the first, and late ones over a random KV cache, where an attention split spans
several blocks of positions)."""
import dataclasses

import pytest
import torch
from conftest import MODEL_FILE, random_cache, rel_err, tiny

import kogc
from kogc.settings import INTERPRETER_TILES
from kogc.cli import main
from kogc.errors import KogcError
from kogc.ir import execute
from kogc.runtime import KernelHangError
from kogc.runtime.kernel import fill_kv_from

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path (GPU covered by test_gpu)")

# pos 0 and 1 write an empty cache; 37 and 38 read 37-38 random rows in 2 splits of 19-20 positions,
# i.e. two blocks of 16 each, the last one partly masked
POSITIONS = (0, 1, 37, 38)


def run_against_references(model, positions=POSITIONS, seed=0, tile_config=None, ck=None):
    """(pos, kernel logits, token, IR logits, IR token, eager logits, eager token) per position, all
    three starting from the same random KV cache (the kernel `ck` of the model, else compiled here)."""
    random_cache(model, seed)
    ck = ck or kogc.compile(model, target="h200", tile_config=tile_config)
    assert ck.interpret and len(ck.schedule.queues) == 1
    fill_kv_from(ck, model)
    weights = dict(model.named_parameters())
    state = {k: v.clone() for k, v in model.named_buffers() if k.endswith("_cache")}
    gen = torch.Generator().manual_seed(seed)
    for pos in positions:
        tok = int(torch.randint(0, model.config.vocab_size, (), generator=gen))
        logits, nxt = ck.step(tok, pos)
        (ir_logits, ir_nxt), _ = execute(ck.ir, weights, state, [tok, pos])
        eager_logits, eager_nxt = model(torch.tensor(tok), torch.tensor(pos))
        yield pos, logits, nxt, ir_logits, int(ir_nxt), eager_logits, int(eager_nxt)


@pytest.mark.parametrize("lanes", [2, 4])     # (one lane: every ordinary decoder, tests/test_ordinary.py)
def test_kernel_equals_ir_and_eager_fp32(lanes):
    model = tiny(seed=100 + lanes, num_lanes=lanes, replicated_rmsn_scale=lanes != 2)
    for pos, logits, nxt, ir, ir_nxt, eager, eager_nxt in run_against_references(model, seed=lanes):
        assert rel_err(logits, ir) < 1e-5, f"pos {pos}"
        assert rel_err(logits, eager) < 1e-5, f"pos {pos}"
        assert nxt == ir_nxt == eager_nxt


@pytest.mark.parametrize("lanes,ffn,dtype", [(2, 96, torch.float32), (2, 160, torch.float16), (2, 144, torch.float32),
                                             (2, 280, torch.float16), (2, 24, torch.float32)])
def test_ffn_width_not_a_power_of_two(lanes, ffn, dtype):
    # W2's input K per lane (kogc.scheduler.tasks.column_parts): 48 and 80 in one part of 64 and 128 masked lanes
    # (as Llama-3-8B's 14336 over 8 lanes, 1792 in 2048); within 9/8 of a power of two, two parts: 72 = 64 + 8
    # exactly, 140 = 128 + 12 in 16 masked lanes; 12 in 16 lanes (a first part under 16 would lose the alignment)
    model = tiny(seed=31, num_lanes=lanes, intermediate_size=ffn, dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for pos, logits, nxt, ir, ir_nxt, eager, eager_nxt in run_against_references(model, (0, 37), seed=5):
        assert rel_err(logits, ir) < tol and rel_err(logits, eager) < tol, f"pos {pos}"
        assert nxt == int(torch.argmax(logits))


def test_fp16_with_tensor_core_attention_close_to_eager():
    # head_dim 16 and a 16-bit cache: attention takes tl.dot (P rounded to fp16 for P.V); delay 2
    model = tiny(seed=7, num_lanes=2, hidden_size=128, broadcast_delay=2, dtype=torch.float16)
    for pos, logits, nxt, ir, ir_nxt, eager, eager_nxt in run_against_references(model, seed=9):
        assert logits.dtype == torch.float16
        assert rel_err(logits, eager) < 1e-2 and rel_err(logits, ir) < 1e-2, f"pos {pos}"
        assert nxt == int(torch.argmax(logits))          # the kernel's own argmax is exact on its logits


def test_tensor_core_attention_is_chosen_where_it_applies():
    from kogc.frontend import to_ir
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.targets import H200

    def impls(tile_config=None, **model):
        s = build_schedule(to_ir(tiny(**model)), H200, "sequential", tile_config)
        return {(v[5], v[6]) for v in s.variants if v[0] == "attention"}
    assert impls(hidden_size=128, dtype=torch.float16) == {(128, "dot")}                # head_dim 16: at most 128
    assert impls(hidden_size=512, dtype=torch.float16) == {(128, "dot")}                # head_dim 64: 16 KB of keys
    assert impls(hidden_size=1024, dtype=torch.float16) == {(64, "dot")}                # head_dim 128
    # where the last split combines (an attention output wider than attn_combine_width), 64 at most
    assert impls(TileConfig(attn_combine_width=64), hidden_size=512, dtype=torch.float16) == {(64, "dot")}
    assert impls(hidden_size=128) == {(16, "reduce")}                              # fp32 cache: exact
    assert impls(dtype=torch.float16) == {(16, "reduce")}                          # head_dim 8 < 16
    assert impls(TileConfig(attn_block=8), hidden_size=128, dtype=torch.float16) == {(8, "reduce")}


def test_kernel_comm_variants():
    for flags in (dict(use_comm=False), dict(use_early_comm=False)):
        model = tiny(seed=11, num_lanes=2, **flags)
        for pos, logits, nxt, ir, ir_nxt, eager, eager_nxt in run_against_references(model, (0, 37), seed=1):
            assert rel_err(logits, eager) < 1e-5


def test_a_kernel_compiled_again_within_a_scope_runs_the_schedule_built_before():
    """kogc bench's profiled kernel: compiled in schedules_reused() beside the kernel it profiles, it takes
    that kernel's schedule (nothing scheduled twice) and computes the same; with several ranks too."""
    from kogc.scheduler.reuse import schedules_reused
    model = tiny(seed=7, num_lanes=2)
    with schedules_reused():
        a, b = kogc.compile(model), kogc.compile(model)
        ranks_a = kogc.compile(model, gpus=2, one_gpu=True)
        ranks_b = kogc.compile(model, gpus=2, one_gpu=True)
    assert b.schedule is a.schedule and ranks_b.schedules is ranks_a.schedules
    assert kogc.compile(model).schedule is not a.schedule
    la, ta = a.step(3, 0)
    lb, tb = b.step(3, 0)
    assert torch.equal(la, lb) and ta == tb
    ra, rta = ranks_a.step(3, 0)
    rb, rtb = ranks_b.step(3, 0)
    assert torch.equal(ra, rb) and rta == rtb and rel_err(ra, la) < 1e-5


@pytest.fixture(scope="module")
def tiny_kernel():
    return kogc.compile(tiny(num_lanes=2))


def test_bad_inputs_are_refused_before_launch(tiny_kernel):
    ck = tiny_kernel
    epoch = ck.epoch
    with pytest.raises(KogcError, match="outside the vocabulary"):
        ck.step(10_000, 0)
    with pytest.raises(KogcError, match="outside the KV cache"):
        ck.step(1, ck.max_pos)
    with pytest.raises(KogcError, match="token must be an integer, got 1.5"):
        ck.step(1.5, 0)                                   # not truncated to 1
    with pytest.raises(KogcError, match="position must be an integer"):
        ck.step(1, torch.tensor(0.0))
    assert ck.epoch == epoch


def test_compile_refuses_bad_options_by_name_and_takes_tile_fields_as_a_dict():
    from kogc.scheduler import SchedulerError
    with pytest.raises(KogcError, match="takes a torch.nn.Module"):
        kogc.compile(42)
    with pytest.raises(KogcError, match="TileConfig or a dict"):
        kogc.compile(tiny(num_lanes=2), tile_config=4096)
    with pytest.raises(SchedulerError, match="unknown field"):
        kogc.compile(tiny(num_lanes=2), tile_config={"tile_size": 4096})
    for kwargs, words in ((dict(gpus="2"), "gpus must be a whole number"), (dict(num_programs=0), "num_programs"),
                          (dict(num_warps=3), "num_warps must be a power of two"), (dict(max_len=-1), "max_len"),
                          (dict(target="tpu"), "unknown target 'tpu'"), (dict(device="tpu:0"), "device 'tpu:0'")):
        with pytest.raises(KogcError, match=words):
            kogc.compile(tiny(num_lanes=2), **kwargs)
    ck = kogc.compile(tiny(num_lanes=2), tile_config={"tile_bytes": 1024})
    assert ck.schedule.tile_config.tile_bytes == 1024


@pytest.mark.parametrize("which", [0, 1])
def test_watchdog_names_the_stuck_task(which):
    ck = kogc.compile(tiny(num_lanes=2))
    # make one wait impossible at run time (the compile-time check cannot see a tampered table): the
    # first wait of a task with several (read with the number of waits) or the second (in the loop)
    table = ck.buffers.TABLE
    slot = next(i for i in range(table.shape[1]) if table[0, i, 3] > 1)
    from kogc.scheduler.tasks import NARGS
    table[0, slot, ck.schedule.header + NARGS + 2 * which + 1] = 1_000_000
    ck.watchdog_spins = 50
    tid = ck.schedule.queues[0][slot]
    with pytest.raises(KernelHangError, match=f"task {tid} .*counter .*needed 1000000"):
        ck.step(1, 0)
    with pytest.raises(KernelHangError, match="earlier launch"):
        ck.step(1, 0)


class _NoIteration(list):
    def __iter__(self):
        raise AssertionError("launch walked the task list")


def test_launch_does_no_per_task_host_work():
    # a step loop launches once per token: a walk over the 127k tasks of laneformer-2b there once
    # cost 10 ms of host time per launch (5x the step itself); the launch must use precomputed values
    ck = kogc.compile(tiny(num_lanes=2))
    ck.schedule.tasks = _NoIteration(ck.schedule.tasks)
    ck.schedule.queues = _NoIteration(ck.schedule.queues)
    ck.launch(3, 0, nsteps=2)


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


def test_kernel_text_is_one_kernel():
    # the streams' cache hints and the step-end prefetch are part of the one kernel; nothing in the
    # text depends on a configuration flag
    from kogc.codegen.render import render
    from kogc.frontend import to_ir
    from kogc.scheduler import build_schedule
    from kogc.targets import H200, MI300X
    ir = to_ir(tiny(num_lanes=2, dtype=torch.float16))
    src = render(build_schedule(ir, H200, num_programs=8))
    assert 'w = tl.load(W + w_idx, eviction_policy="evict_first")' in src
    assert 'n = tl.load(row + 3, eviction_policy="evict_last")' in src
    assert all("evict_first" in line for line in src.splitlines() if "tl.load(KV" in line)
    assert "prefetch.global.L2" in src and "STEP_PREFETCH = tl.constexpr(16384)" in src
    amd = render(build_schedule(ir, MI300X, num_programs=8))     # no prefetch instruction there
    assert "prefetch.global" not in amd and "STEP_PREFETCH = tl.constexpr(0)" in amd
    assert "prefetch.global" not in render(build_schedule(ir, H200, num_programs=8), interpret=True)


@pytest.mark.parametrize("stage,needle", [("tasks", "matvec/"), ("schedule", "programs"),
                                          ("source", "@triton.jit")])
def test_cli_emits_stages(capsys, stage, needle):
    assert main(["compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--emit", stage]) == 0
    assert needle in capsys.readouterr().out


def test_cli_tile_config(capsys):
    # --tile-config reaches the scheduler; bad JSON, unknown fields and bad values exit 2 by name
    assert main(["compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--emit", "tasks",
                 "--tile-config", '{"attn_splits": 4}']) == 0
    out = capsys.readouterr().out
    g, hd, splits = out.split(" attention/")[1].split()[0].split("/")[:3]      # the variant's fields
    assert splits == "4"
    for bad, needle in (("{nope", "not JSON"), ('{"attn_split": 4}', "unknown field(s) attn_split"),
                        ('[1]', "JSON object"), ('{"attn_impl": "dot"}', "unknown field(s) attn_impl"),
                        ('{"attn_splits": 3}', "attn_splits=3 must be 0 (chosen for the model) or a power of two"),
                        ('{"tile_bytes": 100}', "tile_bytes=100"),
                        ('{"kind_us": {"attention": -1}}', "kind_us")):
        assert main(["compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--emit", "tasks",
                     "--tile-config", bad]) == 2
        assert needle in capsys.readouterr().err


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
        assert a >= 4          # (the residual blocks and vectors of 256 fp16 elements allow 16)


@pytest.mark.parametrize("lanes,splits", [(1, 2), (2, 4)])
def test_last_attention_split_combines(lanes, splits):
    # attention wider than attn_combine_width (0 here): the last split of each (lane, KV head) to finish
    # (an arrival counter growing by the splits every step) combines the partials into o; Wo reads o
    # with a plain prologue. Single steps equal eager, and a generation in one launch (the counters
    # across steps) equals the step loop
    cfg = dataclasses.replace(INTERPRETER_TILES, attn_combine_width=0, attn_splits=splits)
    model = tiny(seed=61 + lanes, num_lanes=lanes, hidden_size=64)
    ck = kogc.compile(model, target="h200", tile_config=cfg)
    for pos, logits, nxt, ir, ir_nxt, eager, eager_nxt in run_against_references(model, seed=3, ck=ck):
        assert rel_err(logits, eager) < 1e-5, f"pos {pos}"
        assert nxt == eager_nxt
    kinds = {t.kind_key for t in ck.schedule.tasks}
    assert "matvec/plain/residual" in kinds and not any("attn_combine" in k for k in kinds)
    assert sum("last" in v for v in ck.schedule.variants if v[0] == "attention") == 1
    loop, tok = [], 3
    for pos in range(3):
        _, tok = ck.step(tok, pos)
        loop.append(int(tok))
    assert ck.generate([3], 3) == loop      # the same kernel: its counters carry on from all its launches


@pytest.mark.parametrize("combine_width", [0, 512])
def test_normalised_partials_combine_to_eager(combine_width):
    # each split stores its normalised output and log-sum-exp (a split with no rows yet, as
    # 3 of 4 at position 0: a zero output weighed 0); combined by the last split (width 0) or in Wo's
    # prologue, single steps equal eager
    cfg = dataclasses.replace(INTERPRETER_TILES, attn_combine_width=combine_width, attn_splits=4)
    model = tiny(seed=71, num_lanes=2, hidden_size=64)
    ck = kogc.compile(model, target="h200", tile_config=cfg)
    for pos, logits, nxt, ir, ir_nxt, eager, eager_nxt in run_against_references(model, seed=5, ck=ck):
        assert rel_err(logits, eager) < 1e-5, f"pos {pos}"
        assert nxt == eager_nxt


def test_who_combines_the_attention_splits():
    # Wo's tasks combine the splits up to attn_combine_width per lane (16 splits, fewer where their
    # partials would exceed a tile's bytes); wider, the last split combines and 16 splits stay
    from kogc.analysis.phases import phase_of
    from kogc.frontend import to_ir
    from kogc.scheduler import SchedulerError, TileConfig, build_schedule
    from kogc.scheduler.config import tile_config_from_json
    from kogc.targets import H200
    ir = to_ir(tiny(num_lanes=2, hidden_size=128))
    width = next(n.type.shape[0] for n in ir.nodes if n.op.value == "attention")

    def schedule(**cfg):
        return build_schedule(ir, H200, "sequential", TileConfig(**cfg))
    for cw, tile_bytes, want_last, want_splits in [(width, 32768, False, 16), (width, 4 * width * 4, False, 4),
                                                   (width - 1, 4 * width * 4, True, 16)]:
        s = schedule(attn_combine_width=cw, tile_bytes=tile_bytes)
        att = [v for v in s.variants if v[0] == "attention"]
        assert [("last" in v, v[3]) for v in att] == [(want_last, want_splits)]
        assert {phase_of(s)(t) for t in s.tasks if t.kind == "matvec" and t.variant[4] == "residual"} >= {"Wo"}
    with pytest.raises(SchedulerError, match="attn_combine_width"):
        tile_config_from_json('{"attn_combine_width": 1024}')

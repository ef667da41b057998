"""MI300X without an AMD GPU: the XCD-aware placement (its invariants, and its schedule run task by task
under the interpreter against eager), and the synchronisation of the gfx942 build checked in its ISA
(kogc.codegen.amd_isa): laneformer-2b's code as rank 0 of two, and tiny on one GPU."""
import dataclasses

import pytest
import torch

from conftest import lf, tiny
from kogc.settings import INTERPRETER_TILES
from kogc.codegen import amd_isa
from kogc.frontend import to_ir
from kogc.scheduler import TileConfig, build_schedule
from kogc.scheduler.place import die_edge_share
from kogc.scheduler.ranks import build_rank_schedules
from kogc.targets import MI300X

L8 = dict(num_lanes=8, num_key_value_heads=8)


# laneformer-2b cut to 2 layers and a 16,384-token vocabulary: its rank-0 kernel (of two, FP8) is
# laneformer-2b's line for line but for the comments (the kernel's text depends on the set of code
# variants, not on the number of layers; the vocabulary fixes the argmax's and key sends' sizes, which
# reach 2b's at 16,384), and it schedules in a second instead of half a minute
LANEFORMER_2B_CODE = dict(num_hidden_layers=2, vocab_size=16384)


@pytest.fixture(scope="module")
def gfx942_builds(tmp_path_factory):
    """{"rank0": (amdgcn, ttir, kernel source, schedule), "graph": the model's IR} of laneformer-2b's code for gfx942, rank 0 of two, with FP8
    weights (E4M3FNUZ there): its counters are published and acquired at agent scope within the GPU and
    at system scope to and from the other rank. (tiny's one-GPU build: the last test here.)"""
    from kogc.codegen.aot import compile_kernel
    from kogc.codegen.render import KERNEL_NAME, render, signature
    tmp = tmp_path_factory.mktemp("gfx942")
    cfg = dataclasses.replace(lf.PRESETS["laneformer-2b"], **LANEFORMER_2B_CODE)
    g = to_ir(lf.build(cfg, device="meta", seed=None))
    s = build_rank_schedules(g, 2, MI300X, tile_config=TileConfig(weights="fp8"))[0]
    src = render(s)
    (tmp / "rank0.py").write_text(src)
    sig, consts = signature(s)
    arts = compile_kernel(str(tmp / "rank0.py"), KERNEL_NAME, sig, consts, "mi300x", str(tmp / "rank0"),
                          num_warps=MI300X.num_warps)
    return {"rank0": (open(arts["amdgcn"]).read(), open(arts["ttir"]).read(), src, s), "graph": g}


def test_gfx942_publishes_and_acquires_are_agent_scoped_in_the_isa(gfx942_builds):
    asm, ttir, src, _ = gfx942_builds["rank0"]
    r = amd_isa.check(asm, ttir, src)
    assert r["publishes"] >= 1 and r["acquires"] >= 1
    assert r["problems"] == []


def test_gfx942_streams_fp8_weights(gfx942_builds):
    # the weight stream is E4M3FNUZ (Triton's fp8e4b8) and converted by the hardware's FP8 unpack
    asm, ttir, src, _ = gfx942_builds["rank0"]
    assert "!tt.ptr<f8E4M3FNUZ>" in ttir and "v_cvt_pk_f32_fp8" in asm


def test_the_isa_check_fails_what_it_should(gfx942_builds):
    """Without the writeback before the barrier, without an invalidate after an acquire, with a
    volatile load: each is a problem."""
    asm, ttir, src, _ = gfx942_builds["rank0"]
    no_fence = asm.replace("buffer_wbl2 sc1\n\ts_waitcnt vmcnt(0)", "s_nop 0").replace(
        "buffer_wbl2 sc0 sc1\n\ts_waitcnt vmcnt(0)", "s_nop 0")
    assert any("writeback" in p for p in amd_isa.check(no_fence, ttir, src)["problems"])
    no_inv = asm.replace("buffer_inv sc1", "s_nop 0")
    assert any("invalidate" in p for p in amd_isa.check(no_inv, ttir, src)["problems"])
    volatile = "\n".join(ln + (" {isVolatile = true}" if "tt.load" in ln else "") for ln in ttir.splitlines())
    assert any("volatile" in p for p in amd_isa.check(asm, volatile, src)["problems"])


def test_xcd_placement_keeps_a_lanes_chain_on_its_die():
    """Program p is on XCD p % 8; the XCD-aware placement runs most of a lane's tasks on the lane's XCD
    and keeps more dependency edges inside one XCD than the same tasks placed without it."""
    g = to_ir(tiny(**L8, num_hidden_layers=2))
    aware = build_schedule(g, MI300X, num_programs=32)
    flat = build_schedule(g, dataclasses.replace(MI300X, dies=1, cross_die_hop_us=0.0), num_programs=32)
    die = {tid: p % 8 for p, q in enumerate(aware.queues) for tid in q}
    lane_tasks = [t for t in aware.tasks if t.lane >= 0]
    at_home = sum(die[t.id] == t.lane % 8 for t in lane_tasks) / len(lane_tasks)
    assert at_home > 0.5
    assert die_edge_share(aware.tasks, aware.queues, 8) > die_edge_share(flat.tasks, flat.queues, 8)
    assert "dependency edges within one die" in aware.report()


def test_chiplet_placement_keeps_the_steal_wait_of_the_lower_estimate(monkeypatch):
    """On a chiplet target the placement runs once per steal wait and keeps the queues of the lower
    estimated makespan (a rank's few lanes on pairs of XCDs want a longer wait than one GPU's eight);
    an NVIDIA target places once."""
    import kogc.scheduler.place as place
    import kogc.scheduler.schedule as schedule
    from kogc.targets import H200
    g = to_ir(tiny(**L8, num_hidden_layers=2))
    seen = []
    real = place.place_parallel

    def spy(*a, **k):
        queues, est = real(*a, **k)
        seen.append((k["steal_wait_s"], est, queues))
        return queues, est
    monkeypatch.setattr(schedule, "place_parallel", spy)
    s = build_schedule(g, MI300X, num_programs=32)
    assert [w for w, _, _ in seen] == list(schedule.STEAL_WAITS_S)
    best = min(seen, key=lambda x: x[1])
    assert s.queues == best[2] and s.est_seconds == best[1]
    seen.clear()
    ranks = build_rank_schedules(g, 2, MI300X, num_programs=32)      # each rank: both waits, in rank order
    assert len(seen) == 4
    for r, pair in zip(ranks, (seen[:2], seen[2:])):
        assert r.est_seconds == min(e for _, e, _ in pair)
    seen.clear()
    build_schedule(g, H200, num_programs=32)
    assert len(seen) == 1


def test_xcd_placement_of_laneformer_2b_code(gfx942_builds):
    """laneformer-2b's shapes on all 304 programs: on one GPU each lane's tasks mostly on its XCD; as
    rank 0 of two (4 lanes) on its pair of XCDs; both keep more dependency edges inside one XCD than the
    same tasks placed without the topology, and the report gives the share."""
    g = gfx942_builds["graph"]
    flat_target = dataclasses.replace(MI300X, dies=1, cross_die_hop_us=0.0)
    one_gpu = (build_schedule(g, MI300X), build_schedule(g, flat_target), 8)
    rank0 = (gfx942_builds["rank0"][3], build_rank_schedules(g, 2, flat_target, tile_config=TileConfig(weights="fp8"))[0], 4)
    for aware, flat, homes in (one_gpu, rank0):
        assert aware.num_programs == 304
        home_of = {tid: (p % 8) * homes // 8 for p, q in enumerate(aware.queues) for tid in q}
        lane_tasks = [t for t in aware.tasks if t.lane >= 0]
        at_home = sum(home_of[t.id] == t.lane % homes for t in lane_tasks) / len(lane_tasks)
        print(f"[amd] {homes} homes: {at_home:.1%} of lane tasks at home, edges within a die "
              f"{die_edge_share(aware.tasks, aware.queues, 8):.1%} against {die_edge_share(flat.tasks, flat.queues, 8):.1%}")
        assert at_home > 0.5
        assert die_edge_share(aware.tasks, aware.queues, 8) > die_edge_share(flat.tasks, flat.queues, 8) + 0.05
        assert "dependency edges within one die" in aware.report()


def test_xcd_aware_schedule_equals_eager_task_by_task():
    """The MI300X placement's own queues and weight streams, run one task per launch under the
    interpreter in an order the waits allow, give the IR reference's and eager's logits and tokens."""
    from kogc.ir.executor import execute, new_state
    from kogc.runtime.emulate import step_task_by_task
    from kogc.runtime.kernel import CompiledKernel, weights_of
    model = tiny(seed=5, **L8, num_hidden_layers=2)
    g = to_ir(model)
    s = build_schedule(g, MI300X, "parallel", INTERPRETER_TILES, num_programs=16)
    weights, state = weights_of(model, g), new_state(g)
    ck = CompiledKernel(g, s, weights, "cpu", True)
    for pos, tok in enumerate([3]):
        with torch.no_grad():
            el, et = model(torch.tensor(tok), torch.tensor(pos))
        (rl, rt), _ = execute(g, weights, state, [tok, pos])
        logits, got = step_task_by_task(ck, tok, pos)
        assert torch.allclose(logits, rl, atol=1e-5, rtol=1e-5) and got == int(rt)
        assert torch.allclose(logits, el, atol=1e-5, rtol=1e-5) and got == int(et)


def test_kogc_compile_for_mi300x_checks_its_synchronisation(tmp_path):
    """Every `kogc compile --target mi300x` checks its build's ISA and says so in report.txt."""
    import os
    from conftest import MODEL_FILE
    from kogc.cli import main
    assert main(["compile", MODEL_FILE, "--target", "mi300x", "--config", "tiny", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "gfx942" / "kogc_monokernel.hsaco").read_bytes()[:4] == b"\x7fELF"
    report = (tmp_path / "report.txt").read_text()
    assert "synchronisation (gfx942 ISA):" in report and ", 0 problems" in report
    assert "dependency edges within one die" in report and os.path.getsize(tmp_path / "schedule.json") > 0


"""Delayed tensor parallelism without several GPUs: every rank's kernel under Triton's interpreter in
one process (kogc.runtime.ranks), against eager and the IR reference; the schedules' cross-rank
soundness check; the errors a user gets."""
import dataclasses
import os

import pytest
import torch

import kogc
from conftest import tiny
from kogc.settings import INTERPRETER_TILES
from kogc.fp8 import fake_quantize_module
from kogc.frontend import to_ir
from kogc.ir.executor import execute, new_state
from kogc.ir.shard import ShardError, shard, vocab_shard
from kogc.runtime.kernel import weights_of
from kogc.scheduler import SchedulerError, build_schedule
from kogc.scheduler.ranks import build_rank_schedules
from kogc.targets import get_target

H200 = get_target("h200")
L8 = dict(num_lanes=8, num_key_value_heads=8)        # 8 lanes: one KV head each
ONE_SPLIT = dataclasses.replace(INTERPRETER_TILES, attn_splits=1)   # fewer tasks to interpret


def _eager_steps(model, tokens):
    model.reset_cache()
    out = []
    with torch.no_grad():
        for pos, tok in enumerate(tokens):
            out.append(model(torch.tensor(tok), torch.tensor(pos)))
    return out


def check_steps(gpus: int, overrides: dict, steps: int = 3, weights: str = "model", tiles: dict | None = None) -> None:
    """`steps` steps from a fresh cache on fresh random weights: the ranks' logits shards and token,
    gathered, equal eager's and the IR reference's (fp32, 1e-5); 3 steps use both halves of the receive
    buffers (by step parity) and one of them again. FP8 weights: per rank as on one GPU
    (each rank its lanes' and its vocabulary shard's tiles), the references running the same quantized
    weights. `tiles`: TileConfig fields over ONE_SPLIT."""
    model = tiny(seed=gpus, **L8, **overrides)
    ck = kogc.compile(model, gpus=gpus, tile_config=dataclasses.replace(ONE_SPLIT, **(tiles or {})), weights=weights)
    graph = to_ir(model)
    if weights == "fp8":
        fake_quantize_module(model, graph)
    weights, state = weights_of(model, graph), new_state(graph)
    gen = torch.Generator().manual_seed(gpus)
    tokens = torch.randint(0, model.config.vocab_size, (steps,), generator=gen).tolist()
    for pos, (tok, (el, et)) in enumerate(zip(tokens, _eager_steps(model, tokens))):
        (rl, rt), _ = execute(graph, weights, state, [tok, pos])
        logits, got = ck.step(tok, pos)
        assert torch.allclose(logits, el, atol=1e-5, rtol=1e-5), (pos, float((logits - el).abs().max()))
        assert torch.allclose(logits, rl, atol=1e-5, rtol=1e-5)
        assert got == int(et) == int(rt)


# (2 layers where d = 1 is enough for a delayed sum; 3 where d = 2). The first sends and adds its sums in
# blocks of 16 of the 64 elements (a send task a block), the second whole.
@pytest.mark.parametrize("gpus,overrides,weights,tiles", [
    (2, dict(broadcast_delay=1, use_early_comm=True, num_hidden_layers=2), "model", {"elem_block": 16}),
    (4, dict(broadcast_delay=2, use_early_comm=False, replicated_rmsn_scale=False), "fp8", None),
], ids=["G2-d1-early-blocks", "G4-d2-late-perlane-fp8"])
def test_ranks_equal_eager_and_ir_reference(gpus, overrides, weights, tiles):
    check_steps(gpus, overrides, weights=weights, tiles=tiles)


def test_a_sum_is_sent_in_blocks_of_elem_block():
    """A sum is sent by one task per block of `elem_block` elements, all counted on its peers' one receive
    event: a peer's wait needs every block from every other rank."""
    graph = to_ir(tiny(**L8))
    told = []
    s = build_rank_schedules(graph, 2, H200, tile_config=dataclasses.replace(INTERPRETER_TILES, elem_block=16),
                             num_programs=16, progress=lambda stage, seconds: told.append(stage))[0]
    assert told == [f"rank {r} {stage}" for r in (0, 1) for stage in ("tile", "deps", "place")] + [
        "prune (all ranks)", "check (all ranks)"]
    blocked = [x for x in s.exchanges if len(x.sends) > 1]
    assert blocked and all(len(x.sends) == 64 // 16 for x in blocked)
    for x in blocked:
        assert {s.tasks[i].variant for i in x.sends} == {("send", 16, 4, 64)}
        assert s.events[x.event].need == len(x.sends)      # one peer, each block once


def test_rank_graphs_hold_their_lanes_and_a_vocabulary_shard():
    graph = to_ir(tiny(**L8, vocab_size=250))
    parts = [shard(graph, 4, r) for r in range(4)]
    assert [p.meta["lane0"] for p in parts] == [0, 2, 4, 6]
    assert all(n.type.lanes in (0, 2) for p in parts for n in p.nodes if n.type is not None)
    heads = [p.by_name()[p.output.inputs[0]].type.shape[0] for p in parts]
    assert heads == [vocab_shard(250, 4, r)[1] for r in range(4)] and sum(heads) == 250


def test_cross_rank_soundness_check_rejects_a_dropped_wait():
    """Drop one wait on a peer's send (a residual reading the other ranks' sums): the joint simulation
    must refuse it, naming the race."""
    graph = to_ir(tiny())
    schedules = build_rank_schedules(graph, 2, H200, "sequential", check=False)
    s = schedules[1]
    t = next(t for t in s.tasks if any(g >= s.first_remote for g, _ in t.waits))
    t.waits = [(g, n) for g, n in t.waits if g < s.first_remote]
    from kogc.scheduler.ranks import _Combined
    from kogc.scheduler.check import check_schedule
    view = _Combined(schedules)
    with pytest.raises(SchedulerError, match="race|deadlock"):
        check_schedule(view.tasks, view.events, view.queues, view.also)


def test_parallel_rank_schedules_are_proven_and_alike():
    """The GPU placement of 4 ranks: proven together (build_rank_schedules checks), every rank with the
    same tasks and events, each holding its own lanes' weights only."""
    graph = to_ir(tiny(**L8))
    schedules = build_rank_schedules(graph, 4, H200, num_programs=16)
    lanes = [{t.weight.lane for t in s.tasks if t.weight and t.weight.lane >= 0} for s in schedules]
    assert lanes == [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
    assert len({len(s.tasks) for s in schedules}) == 1
    kinds = {t.kind for t in schedules[0].tasks}
    assert {"send", "combine", "keysend"} <= kinds


def _last_producers(s):
    last = [max(e.tasks, default=-1) for e in s.events]
    for x in s.exchanges:
        last[x.event] = max(x.sends)
    return last


def test_waits_run_oldest_producer_first():
    """A task acquires its events in the order their last producers run, on one GPU and on every rank: a
    peer's delayed sum, sent a layer before, is acquired before the local event the task is waiting for,
    not after it (a round trip on the chain)."""
    graph = to_ir(tiny(**L8))
    one = build_schedule(graph, H200, "parallel", num_programs=16)
    ranks = build_rank_schedules(graph, 4, H200, num_programs=16)
    remote_first = 0
    for s in [one] + ranks:
        last = _last_producers(s)
        for t in s.tasks:
            assert [last[g] for g, _ in t.waits] == sorted(last[g] for g, _ in t.waits), (t.id, t.op, t.waits)
            remote_first += s.first_remote is not None and len(t.waits) > 1 and t.waits[0][0] >= s.first_remote
    assert remote_first > 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(gpus=3), "does not divide the model's 2 lanes"),
    (dict(gpus=0), "must be >= 1"),
])
def test_bad_rank_counts_are_refused(kwargs, match):
    with pytest.raises(ShardError, match=match):
        kogc.compile(tiny(), **kwargs)


def test_a_model_without_lanes_is_refused():
    graph = to_ir(tiny())
    graph = dataclasses.replace(graph, meta=dict(graph.meta, num_lanes=0))
    with pytest.raises(ShardError, match="has no lanes"):
        shard(graph, 2, 0)


def test_cli_compile_writes_one_kernel_per_rank(tmp_path, capsys):
    """`kogc compile --gpus 2 --emit schedule` schedules both ranks (no GPU); with a bad G, exit 2."""
    from kogc.cli import main
    from conftest import MODEL_FILE
    assert main([ "compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--gpus", "2",
                 "--emit", "schedule"]) == 0
    assert "placement parallel" in capsys.readouterr().out
    assert main(["compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--gpus", "3",
                 "--emit", "schedule"]) == 2
    assert "does not divide" in capsys.readouterr().err


def test_only_rank_0_prints_and_writes_a_commands_files(monkeypatch):
    """Under torchrun every rank runs the command; the others print nothing and write no --json (G writers of
    one file could interleave)."""
    import argparse
    import sys

    from kogc.cli_ranks import start_ranks
    for rank, kept in ((0, "out.json"), (1, None)):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setattr(sys, "stdout", sys.stdout)      # restored after the test
        args = argparse.Namespace(json="out.json", task_times=None, gpus=2)
        assert start_ranks(args) is None            # this process runs the command itself
        assert args.json == kept
        assert (getattr(sys.stdout, "name", None) == os.devnull) == (rank != 0)
        if rank:
            sys.stdout.close()


def test_each_ranks_progress_lines_name_the_rank(monkeypatch, capsys):
    from kogc.bench import progress
    progress("compiling", quiet=False)
    assert "[bench " in capsys.readouterr().err
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    progress("compiling", quiet=False)
    assert "[bench rank 3 " in capsys.readouterr().err


def test_a_send_fences_once_for_all_its_peers(tmp_path):
    """A rank of 4 compiled for sm_90: every send raises its first peer's counter with a system-scope release
    and the other two with relaxed adds (the first's fence orders the stores before each: one system-scope
    fence a send, not one a peer)."""
    import time
    from kogc.cli_compile import write_outputs
    from kogc.codegen.render import render
    s0 = build_rank_schedules(to_ir(tiny(num_lanes=4)), 4, H200)[0]
    write_outputs(str(tmp_path), s0.graph, s0, render(s0), H200, time.perf_counter(), 5)   # rank 0's kernel alone
    ptx = (tmp_path / "sm_90" / "kogc_monokernel.ptx").read_text()
    releases = ptx.count("atom.global.sys.release.add")
    relaxed = ptx.count("atom.global.sys.relaxed.add")
    assert releases >= 1 and relaxed == 2 * releases, (releases, relaxed)


@pytest.mark.gpu
def test_two_ranks_on_one_gpu_equal_the_one_gpu_kernel():
    """Two ranks' kernels side by side on this GPU (own streams, half the programs each, the flag
    protocol and scopes of several GPUs): laneformer-0.5b against the one-GPU kernel step by step
    and over a generation (tie-aware), and repeated launches finish (no stuck wait)."""
    from conftest import MODEL_FILE
    from kogc.check import run_check
    res = run_check(MODEL_FILE, "laneformer-0.5b", steps=64, generate=256, gpus=2, one_gpu=True, repeats=10,
                    quiet=True)
    s = res["single_gpu"]
    assert s["max_rel_err"] <= res["max_rel_err_allowed"] and s["argmax_misses"] == 0
    assert s["generated"] == 256 and not s["generation_misses"]
    assert s["hangs"] == 0
    assert res["max_rel_err"] <= res["max_rel_err_allowed"] and not res["argmax_misses"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_two_ranks_on_one_gpu_sample_the_one_gpu_kernels_tokens(dtype, monkeypatch):
    """Temperature sampling, plain and with top-k and top-p, by two ranks side by side on this GPU (every rank
    gathers the whole logits for the filters; the noise is keyed by seed, step and token id) gives the one-GPU
    kernel's tokens, and is not greedy decoding. fp32 logits are searched; an fp16 model's (a rank's fp32 copy of
    fp16 values) are counted per 16-bit key, the peers' shard by count tasks of 48 ids (three a rank)."""
    monkeypatch.setattr("kogc.scheduler.tile.COUNT_CHUNK", 48)
    model = tiny(seed=3, vocab_size=250, num_hidden_layers=2, num_lanes=2, dtype=dtype)    # 125 ids per rank
    single, ranked = kogc.compile(model), kogc.compile(model, gpus=2, one_gpu=True)
    prompt, n = [5], 24
    greedy = single.generate(prompt, n)
    sampled = []
    for kw in (dict(temperature=1.5, seed=1234), dict(temperature=1.0, seed=7, top_k=5, top_p=0.8),
               dict(temperature=2.0, seed=3, top_k=3), dict(temperature=1.0, seed=9, top_p=0.5)):
        single.reset()
        ranked.reset()
        tokens = ranked.generate(prompt, n, **kw)
        assert tokens == single.generate(prompt, n, **kw), kw
        sampled.append(tokens)
    assert any(t != greedy for t in sampled)


def test_two_ranks_of_an_fp16_model_sample_the_one_gpu_kernels_tokens(monkeypatch):
    """top-k and top-p over a rank's fp32 copy of an fp16 model's logits count them per 16-bit key, as the one-GPU
    kernel does over its fp16 logits: the same tokens, and every count cleared after each draw (interpreter). The
    peers' shards in chunks of 48 ids: several count tasks a rank, the last of a peer's range shorter; each
    keysend copies its shard in blocks of 32 (the last shorter)."""
    from kogc.scheduler.tasks import A_HIST, HIST_WORDS
    monkeypatch.setattr("kogc.scheduler.tile.COUNT_CHUNK", 48)
    monkeypatch.setattr("kogc.scheduler.tile.KEYSEND_BLOCK", 32)
    model = tiny(seed=3, vocab_size=250, num_hidden_layers=2, num_lanes=2, dtype=torch.float16)
    single, ranked = kogc.compile(model), kogc.compile(model, gpus=2, one_gpu=True)
    assert [sum(t.kind == "count" for t in s.tasks) for s in ranked.schedules] == [3, 3]     # 125 ids: 48, 48, 29
    kw = dict(temperature=1.0, seed=9, top_k=5, top_p=0.5)
    assert ranked.generate([5], 2, **kw) == single.generate([5], 2, **kw)
    assert ranked.generate([5], 1) == single.generate([5], 1)      # greedy: the count tasks skip their waits
    for k, s in zip(ranked.kernels, ranked.schedules):
        hist = next(t.args[A_HIST] for t in s.tasks if t.kind == "argmax")
        assert not k.buffers.F32[hist:hist + 2 * HIST_WORDS].any(), "counts or key ranges left for the next launch"


def test_four_ranks_of_an_fp16_model_count_as_many_chunks_each_and_sample_the_one_gpu_kernels_tokens(monkeypatch):
    """A middle rank's shard cuts its peers' ids in two ranges, more chunks than an end rank's one range (256 ids
    over 4 ranks in chunks of 48: 5 against 4); the ranks must run the same tasks, so an end rank halves its widest
    chunk (it had been refused). Every rank's chunks cover its peers' ids once, and the draw with top-k and top-p
    over 4 ranks is the one-GPU kernel's (interpreter)."""
    from kogc.scheduler.tasks import A_H, A_X
    from kogc.scheduler.tile import peer_chunks
    monkeypatch.setattr("kogc.scheduler.tile.COUNT_CHUNK", 48)
    V, G = 256, 4
    for r in range(G):
        row0, rows = vocab_shard(V, G, r)
        chunks = peer_chunks(V, (row0, row0 + rows), G)
        assert len(chunks) == 5 and max(c1 - c0 for c0, c1 in chunks) <= 48
        peers = [i for i in range(V) if not row0 <= i < row0 + rows]
        assert sorted(i for c0, c1 in chunks for i in range(c0, c1)) == peers
    model = tiny(seed=4, vocab_size=V, num_hidden_layers=1, num_lanes=4, dtype=torch.float16)
    single, ranked = kogc.compile(model), kogc.compile(model, gpus=G, one_gpu=True)
    for s in ranked.schedules:
        assert sorted((t.args[A_X], t.args[A_H]) for t in s.tasks if t.kind == "count") == \
            sorted((c0, c1 - c0) for c0, c1 in peer_chunks(V, (s.graph.meta["vocab_row0"],
                                                                s.graph.meta["vocab_row0"] + V // G), G))
    kw = dict(temperature=1.0, seed=9, top_k=5, top_p=0.5)
    assert ranked.generate([5], 2, **kw) == single.generate([5], 2, **kw)


def test_a_ranks_count_tasks_cover_its_peers_shards_and_feed_its_draw():
    """An fp16 model's rank counts its peers' logits in count tasks of at most COUNT_CHUNK ids each: together
    every id outside its own shard once, each reading both step parities of its whole logits (fp16 as stored; so
    it waits for the peers' sends and its own keysend); the argmax depends on all of them. fp32 logits (searched)
    have none."""
    from kogc.scheduler.tasks import A_H, A_TERM, A_TERM_STRIDE, A_X
    from kogc.scheduler.tile import COUNT_CHUNK
    V, G = 3 * COUNT_CHUNK + 100, 4
    for dtype, counts in ((torch.float16, True), (torch.float32, False)):
        graph = to_ir(tiny(vocab_size=V, dtype=dtype, **L8))
        for r, s in enumerate(build_rank_schedules(graph, G, H200, num_programs=16)):
            tasks = [t for t in s.tasks if t.kind == "count"]
            assert bool(tasks) == counts
            if not counts:
                continue
            row0, rows = vocab_shard(V, G, r)
            own = range(row0, row0 + rows)
            ids = sorted(i for t in tasks for i in range(t.args[A_X], t.args[A_X] + t.args[A_H]))
            assert ids == [i for i in range(V) if i not in own]
            assert max(t.args[A_H] for t in tasks) == COUNT_CHUNK
            argmax = next(t for t in s.tasks if t.kind == "argmax")
            assert {t.id for t in tasks} <= set(argmax.deps)
            keysend = next(t for t in s.tasks if t.kind == "keysend")
            for t in tasks:
                assert keysend.id in t.deps and any(g >= s.first_remote for g, _ in t.waits)
                # (16-bit values from f32 word A_TERM on: two a word)
                assert {t.args[A_TERM] + (t.args[A_X] + p * t.args[A_TERM_STRIDE]) // 2 for p in (0, 1)} == \
                    {r.start for r in t.reads}


@pytest.mark.parametrize("rule", [True, False])
def test_a_launch_without_a_filtered_draw_may_skip_the_count_tasks_waits(rule, monkeypatch):
    """A count task skips its waits when the launch draws no filtered token, so nothing may count on them: with
    every count task's waits and reads removed, the ranks' pruned schedules still pass the cross-rank soundness
    check (the argmax keeps its own waits for its peers' keys and its keysend). Built as if count tasks always
    waited (`rule` False), the same removal leaves a race."""
    from kogc.scheduler.check import check_schedule
    from kogc.scheduler.ranks import _Combined
    if not rule:
        monkeypatch.setattr("kogc.scheduler.tasks.WAIT_SKIPPING_KINDS", ())
    graph = to_ir(tiny(vocab_size=250, dtype=torch.float16, **L8))
    schedules = build_rank_schedules(graph, 2, H200, num_programs=16)
    for s in schedules:
        for t in s.tasks:
            if t.kind == "count":     # (nor reads anything)
                assert t.waits
                t.waits, t.deps, t.reads = [], [], []
    view = _Combined(schedules)
    if rule:
        check_schedule(view.tasks, view.events, view.queues, view.also)
    else:
        with pytest.raises(SchedulerError, match="race"):
            check_schedule(view.tasks, view.events, view.queues, view.also)


def test_the_speed_model_runs_count_tasks_as_a_greedy_step_does(monkeypatch):
    """kogc predict models a greedy step, where a rank's count tasks only publish: taken as tasks that wait for
    their peers' sends and have a body, the same ranks' step is longer (they lie before the argmax)."""
    from kogc.analysis.ranks import replay_ranks
    from kogc.analysis.stream import StreamParams
    schedules = build_rank_schedules(to_ir(tiny(vocab_size=250, dtype=torch.float16, **L8)), 2, H200, num_programs=16)
    greedy = replay_ranks(schedules, StreamParams(), 3.0)
    monkeypatch.setattr("kogc.scheduler.tasks.WAIT_SKIPPING_KINDS", ())
    assert replay_ranks(schedules, StreamParams(), 3.0) > greedy


def test_the_speed_model_takes_the_bodies_measured_at_a_models_widths():
    """kogc predict's bodies: each Laneformer preset's own table (measured at its hidden size and head_dim), its
    kinds missing from it filled from laneformer-2b's; any other widths laneformer-2b's."""
    from kogc.analysis.body_tables import LANEFORMER_2B, bodies_of, body_table_for
    from kogc.cli_ranks import body_widths
    from kogc.frontend.model_file import build_for_tracing
    laneformer = os.path.join(os.path.dirname(__file__), "..", "examples", "laneformer.py")
    for preset in ("laneformer-0.5b", "laneformer-2b", "laneformer-7b"):
        table = body_table_for(body_widths(to_ir(build_for_tracing(laneformer, preset=preset))))
        assert table.model == preset
        bodies = bodies_of(table)
        assert set(bodies) >= set(LANEFORMER_2B.body_us) and all(bodies[k] == v for k, v in table.body_us.items())
    assert body_table_for(body_widths(to_ir(tiny()))) is LANEFORMER_2B
    assert body_table_for((None, None)) is LANEFORMER_2B and body_table_for((1024, 128)) is LANEFORMER_2B


def test_cli_predict_replays_the_ranks(tmp_path, capsys):
    """`kogc predict`: the ranks' schedules replayed together by the stream model (no GPU), also calibrated
    by a measured step; a file of task times that is not one is refused."""
    import json
    from kogc.cli import main
    from conftest import MODEL_FILE
    out = tmp_path / "p.json"
    assert main(["predict", MODEL_FILE, "--config", "tiny", "--gpus", "1,2", "--measured-ms", "1.0",
                 "--context", "64", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["context"] == 64
    rows = json.loads(out.read_text())["rows"]
    assert [r["gpus"] for r in rows] == [1, 2] and rows[0]["predicted_ms"] == pytest.approx(1.0)
    assert all(r["model_us"] > 0 for r in rows)
    out_text = capsys.readouterr().out
    assert "2 GPU(s)" in out_text and "FP8 tiles" not in out_text
    # no bodies were measured at tiny's widths: laneformer-2b's serve, and that is said unless bodies are given
    from kogc.analysis.body_tables import BODY_TABLES
    from kogc.cli_ranks import body_widths
    from kogc.frontend import to_ir
    assert body_widths(to_ir(tiny())) not in [t.widths for t in BODY_TABLES]
    assert "no bodies were measured at this model's widths" in out_text
    assert json.loads(out.read_text())["bodies"] == "laneformer-2b"
    # FP8 weights with the model's (fp16) bodies: predicted, with a note to give an FP8 profile's
    assert main(["predict", MODEL_FILE, "--config", "tiny", "--gpus", "1", "--weights", "fp8"]) == 0
    assert "give an FP8 profile's with --bodies" in capsys.readouterr().out
    # bodies from a plain profile (three stamps a task): predicted, with a note that they read optimistic
    from test_analysis import played_stamps
    from kogc.scheduler import build_schedule
    from kogc.targets import get_target
    s = build_schedule(to_ir(tiny()), get_target("h200"), num_programs=4)
    plain = played_stamps(s, str(tmp_path / "plain"), model_file=MODEL_FILE, preset="tiny")[0]
    assert main(["predict", MODEL_FILE, "--config", "tiny", "--gpus", "1", "--bodies", plain, "--json", str(out)]) == 0
    out_text = capsys.readouterr().out
    assert "bodies of a plain profile" in out_text and "no bodies were measured" not in out_text
    assert json.loads(out.read_text())["bodies_detail"] is False
    assert json.loads(out.read_text())["context"] == 128        # (1024 by default; tiny's cache holds 128)
    # rank counts below 1 and negative hop times: one clear error, exit 2
    for argv, needle in ((["--gpus", "0,2"], "--gpus takes rank counts >= 1"),
                         (["--remote-us", "-1"], "--remote-us: must be >= 0"),
                         (["--measured-ms", "0"], "--measured-ms: must be > 0"),
                         (["--context", "0"], "--context"),
                         (["--context", "4096"], "--context 4096 does not fit the KV cache of 128 positions"),
                         (["--gpus", "1,3"], "--gpus 3 does not divide")):
        assert main(["predict", MODEL_FILE, "--config", "tiny", *argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and "replaying" not in err     # refused before any replay starts
    # a task-times file that is not one: one clear error, exit 2
    bad = tmp_path / "x.npz"
    bad.write_bytes(b"not an npz")
    assert main(["predict", MODEL_FILE, "--config", "tiny", "--gpus", "1", "--bodies", str(bad)]) == 2
    assert "not a task-times file" in capsys.readouterr().err


def test_a_rank_that_stops_is_named_by_the_others_watchdog():
    """Rank 1 never runs: rank 0's first wait on it hits the watchdog, and the error names the rank."""
    from kogc.runtime.kernel import KernelHangError
    ck = kogc.compile(tiny(num_hidden_layers=1), gpus=2)
    k0 = ck.kernels[0]
    k0.watchdog_spins = 50
    k0.launch(1, 0)                  # every segment of rank 0 in one launch, alone
    with pytest.raises(KernelHangError, match=r"rank 0: wait timed out.*raised by ranks \[1\]"):
        k0.raise_if_stuck()


@pytest.mark.gpu
def test_tp_baseline_runs_in_a_one_rank_group(monkeypatch):
    """The TP=G baseline's step (kogc.bench.tp) captured and replayed in a one-rank NCCL group: the
    code `kogc bench --gpus G` runs on G GPUs."""
    import torch.distributed as dist
    from kogc.bench.tp import tp_graph_step
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29561")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        run, nbytes = tp_graph_step(tiny(), 16, "cuda")
        for i in range(3):
            run(i)
        torch.cuda.synchronize()
        assert nbytes > 0
    finally:
        dist.destroy_process_group()


def test_kogc_inspect_reads_one_rank_alone():
    """A rank's schedule.json replays by itself (kogc inspect): a wait on the peers' sum stands for a
    wait on the rank's own send of it."""
    from kogc.inspection.build import schedule_from_json
    from kogc.scheduler.check import run_order
    s = build_rank_schedules(to_ir(tiny()), 2, H200, num_programs=8)[1]
    b = schedule_from_json(s.to_json(), "rank1/schedule.json")
    assert len(run_order(b.tasks, b.events, b.queues)) == len(b.tasks)
    sends = {b.tasks[x.sends[0]].group for x in s.exchanges}
    assert any(g in sends for t in b.tasks for g, _ in t.waits)


def test_a_rank_of_one_lane_takes_more_attention_splits_the_last_combining():
    """Each rank holding one of a Laneformer's lanes: RANK_OF_ONE_LANE_SPLITS splits, the last combining them (the
    output projection reads o plainly); ranks of several lanes, an ordinary decoder cut into lanes, one GPU and a
    config naming its splits keep the choice as it was."""
    from kogc.frontend import to_ir
    from kogc.ir.lanes import heads_as_lanes
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.scheduler.config import RANK_OF_ONE_LANE_SPLITS
    from kogc.scheduler.ranks import build_rank_schedules
    from kogc.targets import get_target
    h200 = get_target("h200")

    def cfg(graph, G, tc=None):
        s = build_rank_schedules(graph, G, h200, tile_config=tc, num_programs=8)[0] if G > 1 else \
            build_schedule(graph, h200, "parallel", tc, num_programs=8)
        return s.tile_config.attn_splits, s.tile_config.attn_combine_width, {t.variant[3] for t in s.tasks
                                                                             if t.kind == "matvec"}

    one_lane = cfg(to_ir(tiny(num_lanes=2, num_hidden_layers=1)), 2)
    assert one_lane[:2] == (RANK_OF_ONE_LANE_SPLITS, 0) and "attn_combine" not in one_lane[2]
    assert cfg(to_ir(tiny(num_lanes=4, num_hidden_layers=1)), 2)[:2] == (16, 512)
    one_gpu = cfg(to_ir(tiny(num_lanes=2, num_hidden_layers=1)), 1)
    assert one_gpu[:2] == (16, 512) and "attn_combine" in one_gpu[2]
    assert cfg(to_ir(tiny(num_lanes=2, num_hidden_layers=1)), 2, TileConfig(attn_splits=8))[:2] == (8, 512)
    cut = heads_as_lanes(to_ir(tiny(num_lanes=1, num_hidden_layers=1)), 2)
    assert cut.meta["lanes_from_heads"] and cfg(cut, 2)[0] != RANK_OF_ONE_LANE_SPLITS


@pytest.mark.parametrize("spans", [[(0, 8), (8, 16), (20, 24), (30, 40)],       # disjoint: found by bisection
                                   [(0, 8), (4, 16), (20, 24), (2, 40)]])       # overlapping: checked one by one
def test_a_tasks_receive_buffers_are_those_its_reads_overlap(spans):
    """_receivers: per task, the exchanges whose receive buffer its f32 reads overlap, in exchange order, as
    a check of every pair gives; reads of other arenas and touching ends do not count."""
    import random
    from types import SimpleNamespace as NS
    from kogc.scheduler.ranks import _receivers
    from kogc.scheduler.tasks import Region
    rng = random.Random(len(spans) + spans[1][0])
    order = rng.sample(range(len(spans)), len(spans))            # exchanges not in buffer order
    layout = NS(slots={f"r{i}": ("f32", lo, hi - lo) for i, (lo, hi) in enumerate(spans)})   # (arena, start, size)
    exchanges = [NS(recv=f"r{i}") for i in order]
    tasks = []
    for _ in range(300):
        reads = []
        for _ in range(rng.randrange(0, 3)):
            a = rng.randrange(0, 44)
            reads.append(Region(rng.choice(["f32", "f32", "f16"]), a, a + rng.randrange(1, 10)))
        tasks.append(NS(reads=reads))
    want = [[i for i, x in enumerate(exchanges)
             if any(r.arena == "f32" and r.overlaps(Region("f32", layout.slots[x.recv][1],
                                                           layout.slots[x.recv][1] + layout.slots[x.recv][2]))
                    for r in t.reads)] for t in tasks]
    assert _receivers(tasks, layout, exchanges) == want
    assert any(want) and not all(want)

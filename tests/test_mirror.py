"""A rank run alone with its peers mirrored (`kogc bench --gpus G --mirror`): under the interpreter it
computes the model whose lane groups are copies of rank 0's, and its proof refuses what it cannot run."""
import dataclasses

import pytest
import torch

import kogc
from kogc.errors import KogcError
from conftest import tiny
from kogc.frontend import to_ir
from kogc.ir.shard import vocab_shard
from kogc.scheduler import SchedulerError
from kogc.scheduler.ranks import build_rank_schedules, exchange_events, mirrored
from kogc.targets import get_target
from test_ranks import L8, ONE_SPLIT, _eager_steps


def _copied_lane_groups(model, gpus: int):
    """`model` with every lane group a copy of the first (the model a mirrored rank 0 computes)."""
    L = model.config.num_lanes
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.shape[0] == L:
                for q in range(1, gpus):
                    p[q * L // gpus:(q + 1) * L // gpus] = p[:L // gpus]
    return model


@pytest.mark.parametrize("gpus,overrides,weights,tiles", [
    (2, dict(broadcast_delay=1, use_early_comm=True, num_hidden_layers=2), "model", {}),
    (4, dict(broadcast_delay=2, use_early_comm=False, replicated_rmsn_scale=False, num_hidden_layers=3), "model",
     {"elem_block": 16}),
    (2, dict(num_hidden_layers=2), "fp8", {}),
], ids=["G2-d1-early", "G4-d2-late-perlane-blocks", "G2-fp8"])
def test_a_mirrored_rank_computes_the_model_with_copied_lane_groups(gpus, overrides, weights, tiles):
    """Fresh random weights, the lane groups then made copies of rank 0's: the mirror's logits are eager's
    on rank 0's vocabulary shard (fp32, 1e-5) and its token that shard's best, over 3 steps (both halves
    of the receive buffers). FP8: eager runs the same quantized weights. `tiles`: TileConfig fields over
    ONE_SPLIT (elem_block 16: sums sent and added in blocks)."""
    model = _copied_lane_groups(tiny(seed=10 + gpus, **L8, **overrides), gpus)
    ck = kogc.compile(model, gpus=gpus, one_gpu="mirror", tile_config=dataclasses.replace(ONE_SPLIT, **tiles),
                      weights=weights)
    if weights == "fp8":
        from kogc.fp8 import fake_quantize_module
        fake_quantize_module(model, to_ir(model))
    lo, n = vocab_shard(model.config.vocab_size, gpus, 0)
    gen = torch.Generator().manual_seed(gpus)
    tokens = torch.randint(0, model.config.vocab_size, (3,), generator=gen).tolist()
    for pos, (tok, (el, _)) in enumerate(zip(tokens, _eager_steps(model, tokens))):
        logits, got = ck.step(tok, pos)
        want = el[lo:lo + n]
        assert torch.allclose(logits, want, atol=1e-5, rtol=1e-5), (pos, float((logits - want).abs().max()))
        assert got == lo + int(want.argmax())


def test_the_mirror_refuses_a_rank_it_cannot_run():
    """A reader of a received sum without its wait: the mirror's proof names the race before launch."""
    s = build_rank_schedules(to_ir(tiny(**L8)), 2, get_target("h200"), num_programs=8)[0]
    mirrored(s)                                       # the rank as built: proven
    t = next(t for t in s.tasks if any(g >= s.first_remote for g, _ in t.waits))
    t.waits = [(g, n) for g, n in t.waits if g < s.first_remote]
    with pytest.raises(SchedulerError, match="race"):
        mirrored(s)
    with pytest.raises(KogcError, match="one_gpu='bad'"):
        kogc.compile(tiny(), gpus=2, one_gpu="bad")


def test_a_mirrored_rank_profile_reads_as_one_gpus(tmp_path, capsys):
    """The mirror's stamps (here a timeline played by the kernel's rules) are summarised and written
    like one GPU's, and `kogc analyze` builds the mirrored rank's schedule again from the file."""
    from test_analysis import played_stamps

    from kogc.analysis import load_stamps
    from kogc.cli import main
    from kogc.runtime.profile import summarize_times
    from conftest import MODEL_FILE
    overrides = dict(L8, num_hidden_layers=2)
    s = build_rank_schedules(to_ir(tiny(**overrides)), 2, get_target("h200"), num_programs=8)[0]
    m = mirrored(s)
    # every wait on a peer's sum is one on the rank's own send of it
    assert all(g < s.first_remote for t in m.tasks for g, _ in t.waits)
    assert exchange_events(m) == {s.tasks[x.sends[0]].group for x in s.exchanges}
    assert any(g in exchange_events(m) for t in m.tasks for g, _ in t.waits)
    path, ids, ts = played_stamps(s, str(tmp_path / "mirror"), stamps_schedule=m, model_file=MODEL_FILE, preset="tiny",
                                  overrides=overrides)
    summary = summarize_times(m, ids, ts)
    assert summary["per_kind"]["send"]["tasks"] > 0 and summary["span_us"] > 0
    assert load_stamps(path)[2]["mirror_of"] == 2
    assert main(["analyze", "replay", path]) == 0
    assert "step span" in capsys.readouterr().out
    # a hop across GPUs on every wait for a peer's sum: the replay grows with it
    out = tmp_path / "replay.json"
    assert main(["analyze", "replay", path, "--remote-us", "1,20", "--json", str(out)]) == 0
    assert "every wait on a peer's sum 20 us" in capsys.readouterr().out
    import json
    remote = json.loads(out.read_text())["with_overheads"]["remote"]
    assert [r["remote_us"] for r in remote] == [1.0, 20.0] and remote[0]["as_scheduled_us"] < remote[1]["as_scheduled_us"]


@pytest.mark.gpu
def test_a_mirrored_rank_on_the_gpu():
    """The mirror as `kogc bench --gpus G --mirror` runs it: all of this GPU's programs, the parallel
    placement, a cooperative launch, its peer table naming its own buffers. 8 lanes over G = 4, lane
    groups copied: 16 steps equal eager's shard (fp32, 1e-4; the token tie-aware), and 32 tokens from one
    launch equal those of one-step launches; 10 repeated generations finish (no stuck wait)."""
    model = _copied_lane_groups(tiny(seed=7, **L8, num_hidden_layers=3, broadcast_delay=2), 4)
    ck = kogc.compile(model, gpus=4, one_gpu="mirror")
    lo, n = vocab_shard(model.config.vocab_size, 4, 0)
    tokens = torch.randint(0, model.config.vocab_size, (16,), generator=torch.Generator().manual_seed(7)).tolist()
    for pos, (tok, (el, _)) in enumerate(zip(tokens, _eager_steps(model, tokens))):
        logits, got = ck.step(tok, pos)
        want = el[lo:lo + n]
        assert torch.allclose(logits.cpu(), want, atol=1e-4, rtol=1e-4), (pos, float((logits.cpu() - want).abs().max()))
        assert lo <= got < lo + n and want[got - lo] >= want.max() - 1e-4
    ck.reset()
    one_launch = ck.generate([1, 2, 3], 32)
    ck.reset()
    stepped, tok = [], None
    for pos, t in enumerate([1, 2, 3]):
        _, tok = ck.step(t, pos)
    for pos in range(3, 3 + 32):
        stepped.append(tok)
        if len(stepped) < 32:
            _, tok = ck.step(tok, pos)
    assert one_launch == stepped
    for _ in range(10):
        ck.reset()
        assert len(ck.generate([1], 16)) == 16


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter in-process: CPU only")
def test_sweep_of_a_mirrored_rank_under_the_interpreter(tmp_path, capsys):
    """`kogc sweep --gpus 2 --mirror`: each variant rank 0 of 2 with its peers mirrored, checked against
    eager on the model with its lane groups copied (weights and the random cache), on rank 0's shard."""
    import json

    from test_sweep import MICRO

    from kogc.cli import main
    out = tmp_path / "sweep.json"
    rc = main(["sweep", MICRO, "--config", "micro", "--lanes", "2", "--gpus", "2", "--mirror", "--interpret",
               "--context", "5", "--steps", "1", "--reps", "1", "--variants", '[{}, {"attn_splits": 2}]',
               "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and all(r["ok"] and r["mirror_of"] == 2 and r["rel_err_vs_eager"] < 1e-5 for r in rows)
    assert all(r["same_token_as_eager"] for r in rows)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter in-process: CPU only")
def test_under_the_interpreter_a_mirrored_rank_runs_one_step_a_launch(capsys):
    """Its queue is cut before each wait on its peers and the interpreter runs a launch's programs one after
    another: a launch of several steps is refused in one line (it had waited until the watchdog), one step runs."""
    from kogc.cli import main
    from test_sweep import MICRO
    ck = kogc.compile(tiny(seed=2, **L8, num_hidden_layers=1), gpus=2, one_gpu="mirror", tile_config=ONE_SPLIT)
    assert len(ck.generate([1], 1)) == 1
    with pytest.raises(KogcError, match="a launch of 3 steps needs one queue"):
        ck.generate([1], 3)
    assert main(["sweep", MICRO, "--config", "micro", "--lanes", "2", "--gpus", "2", "--mirror", "--interpret",
                 "--context", "5", "--steps", "2", "--reps", "1", "--variants", "[{}]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give --steps 1" in err[0], err


@pytest.mark.parametrize("argv", [["sweep", "--gpus", "2"], ["sweep", "--mirror"], ["bench", "--mirror"],
                                  ["bench", "--gpus", "2", "--mirror", "--one-gpu"]])
def test_mirror_options_that_do_not_go_together_are_refused(argv, capsys):
    from kogc.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kogc: error: ") and ("--mirror" in err[0] or "--gpus" in err[0]), err


def test_the_bench_checks_a_mirrored_rank_against_the_model_it_computes():
    """`kogc bench --gpus G --mirror`'s check (kogc.bench.against_eager): with every lane group's weights and
    random cache made copies of rank 0's, the mirrored rank's step equals eager's on rank 0's vocabulary shard;
    with the cache's lane groups left as drawn it does not (the check can fail)."""
    from kogc.bench.against_eager import check_step, mirror_lane_groups
    from kogc.runtime.kernel import fill_kv_from, kv_cache_buffers, randomize_kv
    model = tiny(seed=5, **L8, num_hidden_layers=2)
    ck = kogc.compile(model, gpus=2, one_gpu="mirror", tile_config=ONE_SPLIT)
    randomize_kv(kv_cache_buffers(ck.ir, model), 6, torch.Generator().manual_seed(5))
    fill_kv_from(ck, model)
    assert not check_step(ck, model, 6, "cpu", mirror_of=2)["ok"]    # other lane groups' weights and cache
    mirror_lane_groups(model, 2)
    fill_kv_from(ck, model)
    c = check_step(ck, model, 6, "cpu", mirror_of=2)
    assert c["ok"] and c["rel_err"] < 1e-5 and c["token"] == c["eager_token"], c

"""`kogc bench` on CPU: the interpreter path produces the table and the JSON (speed is not checked)."""
import json
import os

import pytest
import torch
from conftest import MODEL_FILE

from kogc.cli import main

MICRO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "micro_laneformer.py")

# runs the kernel under Triton's interpreter in this process: a CPU test (a process that runs GPU
# kernels has imported Triton without the interpreter)
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter in-process: CPU only")


@CPU_ONLY
def test_bench_interpreter_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", MICRO, "--config", "micro", "--context", "8", "--steps", "1", "--reps", "2", "--interpret",
               "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "kogc (interpreter, CPU)" in text and "eager (CPU)" in text and "floor:" in text
    res = json.loads(out.read_text())
    names = [row["name"] for row in res["rows"]]
    assert names == ["kogc (interpreter, CPU)", "kogc generate (one launch, interpreter, CPU)", "eager (CPU)"]
    assert all(row["ms_median"] > 0 and len(row["ms_reps"]) == 2 for row in res["rows"])
    assert res["floor"]["bytes_per_token"] > 0 and res["config"]["context"] == 8
    assert len(res["config"]["kernel_source_sha1"]) == 12      # which kernel the figures are of
    assert res["passed"] and res["checks"]["kogc"]["rel_err"] < 1e-4      # checked against eager first
    assert "kogc against eager at position 8: rel err" in text


@CPU_ONLY
def test_bench_of_fp8_weights_gives_the_baselines_the_models_floor(tmp_path, capsys):
    # the baselines stream the model's own (16-bit) weights: their share of the floor and TB/s are of those
    # bytes, as the kogc row with the model's weights is, not of the FP8 kernel's half
    out = tmp_path / "bench.json"
    rc = main(["bench", MICRO, "--config", "micro", "--context", "8", "--steps", "1", "--reps", "1", "--interpret",
               "--weights", "fp8", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    rows = {row["name"]: row for row in res["rows"]}
    full, eager = rows["kogc, model's weights (interpreter, CPU)"], rows["eager (CPU)"]
    assert full["floor_bytes"] > res["floor"]["bytes_per_token"]          # FP8: fewer bytes than the model's
    assert eager["floor_bytes"] == full["floor_bytes"]
    assert eager["TBps"] == pytest.approx(eager["floor_bytes"] / (eager["ms_median"] * 1e-3) / 1e12)
    assert "floor_bytes" not in rows["kogc (interpreter, CPU)"]


@CPU_ONLY
def test_bench_fails_when_the_kernel_computes_something_else(monkeypatch, capsys):
    # the kernel's cache left empty while eager's holds random rows: other logits, so exit code 1
    import kogc.runtime.kernel
    monkeypatch.setattr(kogc.runtime.kernel, "fill_kv_from", lambda ck, model: None)
    rc = main(["bench", MICRO, "--config", "micro", "--context", "8", "--steps", "1", "--reps", "1", "--interpret",
               "--baselines", ""])
    assert rc == 1 and "FAILED" in capsys.readouterr().out
    rc = main(["bench", MICRO, "--scaling", "--config", "micro", "--context", "8", "--steps", "1", "--reps", "1",
               "--interpret"])
    assert rc == 1 and "FAILED" in capsys.readouterr().out


@CPU_ONLY
def test_scaling_table_under_the_interpreter(tmp_path, capsys):
    # presets x contexts, one compile per preset, a row each with the floor's bytes (no bandwidth on CPU)
    out = tmp_path / "scaling.json"
    rc = main(["bench", MICRO, "--scaling", "--config", "micro,micro2", "--context", "4,9", "--steps", "1",
               "--reps", "1", "--interpret", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    res = json.loads(out.read_text())
    assert [(r["preset"], r["context"]) for r in res["rows"]] == [("micro", 4), ("micro", 9), ("micro2", 4),
                                                                   ("micro2", 9)]
    assert all(r["ms_median"] > 0 and r["floor_tok_per_s"] is None for r in res["rows"])
    rows = {(r["preset"], r["context"]): r for r in res["rows"]}
    assert rows[("micro", 9)]["floor_bytes"] > rows[("micro", 4)]["floor_bytes"]          # the cache read grows
    assert rows[("micro2", 4)]["floor_bytes"] > rows[("micro", 4)]["floor_bytes"]         # and the weights
    assert "| preset | parameters | context |" in text and text.count("| micro") == 4
    assert res["passed"] and all(r["check"]["ok"] and r["check"]["position"] == r["context"] for r in res["rows"])
    assert text.count("the same token |") == 4     # each row checked against eager before it was timed


@CPU_ONLY
@pytest.mark.parametrize("argv, message", [
    (["--config", "micro,micro2"], "add --scaling"),
    (["--context", "4,8"], "add --scaling"),
    (["--context", "4,x"], "--context must be comma-separated integers"),
    (["--scaling", "--profile"], "--profile and --task-times do not apply"),
    (["--task-times", "t.npz"], "needs --profile"),
    (["--baselines", "eager,tpu"], "unknown baseline 'tpu'"),
    (["--scaling", "--context", "500"], "do not fit the KV cache"),
    (["--context", "-1"], "--context must be one or more positions >= 0"),
    (["--steps", "0"], "--steps: must be >= 1"),
    (["--reps", "-2"], "--reps: must be >= 1"),
])
def test_bench_bad_input(argv, message, capsys):
    assert main(["bench", MICRO, "--config", "micro", "--interpret", *argv]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[")]
    assert len(err) == 1 and err[0].startswith("kogc: error: ") and message in err[0], err


def test_table_floor_takes_the_higher_bandwidth_reading():
    # a GPU run reads the bandwidth twice and divides by the higher: the table names both readings
    from kogc.bench import format_table
    res = {"config": {"preset": "p", "context": 1024, "steps": 100, "reps": 5, "device": "H200", "date": "d"},
           "floor": {"bytes_per_token": 4.19e9, "read_bw_Bps": 4.19e12, "read_bw_readings_Bps": [4.10e12, 4.19e12],
                     "ms": 1.0},
           "rows": [{"name": "kogc", "ms_median": 1.25, "ms_min": 1.2, "ms_max": 1.3, "tok_per_s": 800.0, "TBps": 3.35},
                    {"name": "cuda_graph", "ms_median": 2.5, "ms_min": 2.5, "ms_max": 2.5, "tok_per_s": 400.0,
                     "TBps": 1.68}]}
    text = format_table(res)
    assert "4.19 TB/s measured read bandwidth (the higher of 4.10, 4.19) = 1.000 ms" in text
    kogc_line = next(line for line in text.splitlines() if line.startswith("kogc"))
    assert kogc_line.split()[-2:] == ["2.00x", "80.0%"]
    # the model-as-written rows say so; the headline is against the strongest row, whichever it is
    assert "cuda_graph (model as written)" in text
    assert "kogc vs the strongest baseline (cuda_graph (model as written)): 2.00x" in text
    res["rows"].append({"name": "handwritten", "ms_median": 2.0, "ms_min": 2.0, "ms_max": 2.0, "tok_per_s": 500.0,
                        "TBps": 2.1})
    assert "kogc vs the strongest baseline (hand-written step, CUDA graph): 1.60x" in format_table(res)


@pytest.mark.parametrize("model_file,preset", [(MODEL_FILE, "tiny"), ("llama.py", "tiny")])
def test_handwritten_step_has_the_models_shapes(model_file, preset):
    # the hand-written baseline reads exactly the matvec weights kogc streams (same shapes, one lane),
    # its step runs (here on the CPU, without its CUDA graph), and it splits over ranks as the TP=G stack
    from conftest import EXAMPLES

    from kogc.bench.handwritten import shapes_of, step_fn
    from kogc.frontend import to_ir
    from kogc.frontend.model_file import build_model
    from kogc.scheduler import build_schedule
    from kogc.targets import H200
    model = build_model(os.path.join(EXAMPLES, model_file) if model_file == "llama.py" else model_file, preset=preset)
    s = build_schedule(to_ir(model), H200, placement="sequential")
    shapes = shapes_of(s)
    step, nbytes = step_fn(shapes, 8, "cpu", dtype=torch.float32)
    assert nbytes == sum(s.weight_bytes_per_program())
    assert torch.isfinite(step()).all()
    sums = []
    half, half_bytes = step_fn(shapes, 8, "cpu", world=2, rank=1, all_reduce=lambda t, op="sum": sums.append(op),
                               dtype=torch.float32)
    half()
    assert half_bytes < nbytes and sums == ["sum", "sum"] * shapes.layers + ["max"]


def test_bench_without_gpu_says_so(capsys):
    import torch
    if torch.cuda.is_available():
        return
    assert main(["bench", MODEL_FILE, "--config", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kogc: error: no GPU here") and "\n" not in err


@pytest.mark.parametrize("argv, message", [
    (["bench", MODEL_FILE, "--config", "tiny", "--baselines", "foo"], "unknown baseline 'foo'"),
    (["bench", MODEL_FILE, "--config", "tiny", "--tile-config", "{bad"], "tile config is not JSON"),
    (["bench", MODEL_FILE, "--config", "tiny", "--scaling", "--weights", "fp8", "--tile-config", "{bad"],
     "tile config is not JSON"),
    (["check", MODEL_FILE, "--config", "tiny", "--prompt-ids", "a"], "--prompt-ids must be comma-separated"),
    (["sweep", MODEL_FILE, "--config", "tiny", "--variants", "[1]"], "--variants must be a JSON list"),
    (["sweep", MODEL_FILE, "--config", "tiny", "--weights", "fp8", "--tile-config", "{bad"], "tile config is not JSON"),
    (["compile", MODEL_FILE, "--config", "tiny", "--tile-config", "{bad", "--out", "unused"],
     "tile config is not JSON"),
    (["compile", MODEL_FILE, "--config", "tiny", "--gpus", "0", "--out", "unused"], "--gpus: must be >= 1"),
])
def test_bad_arguments_are_named_before_any_work(argv, message, capsys):
    """A bad argument is named in one line, also where there is no GPU to run on (not "no GPU here"), and
    before the model is traced."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kogc: error: ") and message in err[0], err
    assert "traced" not in captured.out + captured.err


def test_profile_summary_from_timestamps():
    """The profiler's summary and trace, on synthetic timestamps (the timer itself needs a GPU)."""
    import json as _json
    import types

    import torch
    from conftest import lf

    from kogc.frontend import to_ir
    from kogc.inspection.profiled import chrome_trace
    from kogc.runtime.profile import format_summary, summarize
    from kogc.scheduler import build_schedule
    from kogc.targets import H200

    graph = to_ir(lf.kogc_model("tiny", device="meta", seed=None))
    schedule = build_schedule(graph, H200, num_programs=4)
    maxlen = max(len(q) for q in schedule.queues)
    prof = torch.zeros((4, maxlen, 3), dtype=torch.int64)
    for p, q in enumerate(schedule.queues):      # each task: 1 us of waiting, then 2 us of work
        for i, _ in enumerate(q):
            start = 1_000_000 + i * 3000
            prof[p, i] = torch.tensor([start, start + 1000, start + 3000])
    ck = types.SimpleNamespace(schedule=schedule, buffers=types.SimpleNamespace(PROF=prof))
    s = summarize(ck)
    assert s["tasks"] == len(schedule.tasks)
    assert abs(s["per_kind"]["attention"]["wait_us_mean"] - 1.0) < 1e-9
    assert abs(s["per_kind"]["attention"]["body_us_mean"] - 2.0) < 1e-9
    assert 0 < s["busy_share_min"] <= s["busy_share_mean"] <= 1
    assert "attention" in format_summary(s)
    # the kind means, ready for TileConfig.kind_us (the placement's cost model for this model)
    assert s["kind_us"]["attention"] == 2.0 and set(s["kind_us"]) == set(s["per_kind"])
    line = format_summary(s).splitlines()[-1]
    assert _json.loads(line.split("--tile-config '")[1].rstrip("'")) == {"kind_us": s["kind_us"]}
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        chrome_trace(ck, f.name)
        events = _json.load(open(f.name))["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == 2 * len(schedule.tasks)   # a wait and a body per task


def test_profile_splits_waits_into_blocked_and_notify():
    # a timeline played by the schedule's own rules: a task starts when its program's previous task
    # ends, its waits end 0.5 us after the last producer it waits on (or its start, if later), its
    # body takes 2 us; the summary must recover the blocked and notify parts exactly
    import numpy as np

    from kogc.frontend import to_ir
    from kogc.runtime.profile import summarize_times, wait_split
    from kogc.scheduler import build_schedule
    from kogc.scheduler.check import run_order
    from kogc.targets import H200

    import micro_laneformer      # one lane, one layer: every task kind, fewer code variants to compile
    schedule = build_schedule(to_ir(micro_laneformer.kogc_model("micro", device="meta", seed=None)), H200,
                              num_programs=4)
    prog = {tid: p for p, q in enumerate(schedule.queues) for tid in q}
    last, done, rows = {}, {}, {}
    expect_blocked = {}
    for tid in run_order(schedule.tasks, schedule.events, schedule.queues):
        t = schedule.tasks[tid]
        start = last.get(prog[tid], 0)
        ready = max((done[g] for g, _ in t.waits), default=None)
        after = (max(start, ready) + 500) if ready is not None else start + 200
        end = after + 2000
        rows[tid] = (start, after, end)
        expect_blocked[tid] = max(ready - start, 0) / 1e3 if ready is not None else 0.0
        last[prog[tid]] = end
        done[t.group] = max(done.get(t.group, 0), end)
    ids = np.array([tid for q in schedule.queues for tid in q])
    ts = np.array([rows[tid] for tid in ids], dtype=np.int64)
    blocked, notify = wait_split(schedule, ids, ts)
    for j, tid in enumerate(ids):
        assert blocked[j] == pytest.approx(expect_blocked[tid])
        assert notify[j] == pytest.approx(0.5 if schedule.tasks[tid].waits else 0.2)
    assert blocked.max() > 0                      # the timeline has real waiting in it
    s = summarize_times(schedule, ids, ts)
    assert s["blocked_us_per_program"] == pytest.approx(blocked.sum() / 4)
    assert s["notify_us_per_program"] == pytest.approx(notify.sum() / 4)


def test_trimmed_cache_baseline_is_the_same_function():
    # the fairer graph baseline: same weights (shared), the cache cut to the positions in use
    import torch
    from conftest import tiny

    from kogc.bench.stacks import trim_kv_cache
    model = tiny(seed=4, num_lanes=2)
    gen = torch.Generator().manual_seed(0)
    for name, buf in model.named_buffers():
        buf[:, :, :10].copy_(torch.randn(buf[:, :, :10].shape, generator=gen))
    trimmed = trim_kv_cache(model, 16)
    assert all(b.shape[2] == 16 for b in trimmed.buffers())
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(model.parameters(), trimmed.parameters()))
    with torch.no_grad():
        for pos in (10, 11, 15):
            full, tok = model(torch.tensor(3), torch.tensor(pos))
            cut, tok_cut = trimmed(torch.tensor(3), torch.tensor(pos))
            assert torch.allclose(full, cut, rtol=1e-5, atol=1e-6) and int(tok) == int(tok_cut)
    assert next(model.buffers()).shape[2] == model.config.max_position_embeddings   # the original is intact


def test_detail_profile_summary_and_kernel(tmp_path):
    # profile="detail": two more stamps per task (a matvec's operands arrived, its publish began; the
    # final norm's and the argmax's first operands); the summary splits those bodies into operands /
    # compute / publish; other kinds record 0 there. The kernel with the extra stamps (attention's too)
    # compiles for sm_90 with one more timer read per stamp site
    import types

    import torch

    from kogc.codegen.aot import compile_kernel
    from kogc.codegen.render import KERNEL_NAME, render, signature
    from kogc.frontend import to_ir
    from kogc.runtime.profile import format_summary, summarize
    from kogc.scheduler import build_schedule
    from kogc.targets import H200

    import micro_laneformer      # one lane, one layer: every task kind, fewer code variants to compile
    schedule = build_schedule(to_ir(micro_laneformer.kogc_model("micro", device="meta", seed=None)), H200,
                              num_programs=4)
    prof = torch.zeros((4, max(len(q) for q in schedule.queues), 5), dtype=torch.int64)
    for p, q in enumerate(schedule.queues):      # wait 1 us; then operands 0.5, compute 1, publish 0.5
        for i, tid in enumerate(q):
            s = 1_000_000 + i * 3000
            detail = schedule.tasks[tid].kind in ("matvec", "final_norm", "argmax")
            prof[p, i] = torch.tensor([s, s + 1000, s + 3000, s + 1500 if detail else 0, s + 2500 if detail else 0])
    summary = summarize(types.SimpleNamespace(schedule=schedule, buffers=types.SimpleNamespace(PROF=prof)))
    mv = [v for k, v in summary["per_kind"].items() if k.startswith("matvec")]
    assert mv and all(v["detail_us_mean"] == {"operands": 0.5, "compute": 1.0, "publish": 0.5} for v in mv)
    assert all(summary["per_kind"][k]["detail_us_mean"] == {"operands": 0.5, "compute": 1.0, "publish": 0.5}
               for k in ("final_norm", "argmax"))
    assert "detail_us_mean" not in summary["per_kind"]["attention"]
    assert "operands" in format_summary(summary)
    # (the kinds with detail stamps, one matvec variant of them: a smaller kernel to compile twice)
    kinds = [next(i for i, v in enumerate(schedule.variants) if v[0] == "matvec")] + [
        i for i, v in enumerate(schedule.variants) if v[0] in ("final_norm", "argmax", "attention")]
    (tmp_path / "k.py").write_text(render(schedule, only_variant=tuple(kinds)))
    sig, consts = signature(schedule)
    ptx = {}
    for level in (1, 2):
        arts = compile_kernel(str(tmp_path / "k.py"), KERNEL_NAME, sig, dict(consts, PROFILE=level), "h200",
                              str(tmp_path / f"p{level}"), num_warps=H200.num_warps)
        ptx[level] = open(arts["ptx"]).read().count("%globaltimer")
    assert ptx[2] > ptx[1] > 0


def test_detail_profile_splits_the_final_norms_second_load():
    # a detail profile has a sixth stamp: the final norm's second load
    # arrived; the summary then splits its body into operands / second load / compute / publish
    # (kinds without the stamp keep three parts; five-column profiles saved earlier still read)
    import types

    import torch

    from kogc.frontend import to_ir
    from kogc.runtime.profile import format_summary, summarize
    from kogc.scheduler import build_schedule
    from kogc.targets import H200

    import micro_laneformer      # one lane, one layer: every task kind, fewer code variants to compile
    schedule = build_schedule(to_ir(micro_laneformer.kogc_model("micro", device="meta", seed=None)), H200,
                              num_programs=4)
    prof = torch.zeros((4, max(len(q) for q in schedule.queues), 6), dtype=torch.int64)
    for p, q in enumerate(schedule.queues):      # wait 1 us; operands 0.5, (second load 0.25), compute, publish 0.5
        for i, tid in enumerate(q):
            s = 1_000_000 + i * 3000
            kind = schedule.tasks[tid].kind
            detail = kind in ("matvec", "final_norm", "argmax")
            second = kind in ("final_norm", "attention")     # attention: its blocks computed
            prof[p, i] = torch.tensor([s, s + 1000, s + 3000, s + 1500 if detail or second else 0,
                                       s + 2500 if detail or second else 0, s + 1750 if second else 0])
    summary = summarize(types.SimpleNamespace(schedule=schedule, buffers=types.SimpleNamespace(PROF=prof)))
    for k in ("final_norm", "attention"):
        assert summary["per_kind"][k]["detail_us_mean"] == {
            "operands": 0.5, "second_operands": 0.25, "compute": 0.75, "publish": 0.5}
    mv = [v for k, v in summary["per_kind"].items() if k.startswith("matvec")]
    assert mv and all(v["detail_us_mean"] == {"operands": 0.5, "compute": 1.0, "publish": 0.5} for v in mv)
    text = format_summary(summary)
    assert "2nd load" in text and "0.25" in text and "(attention: operands = the query" in text


def test_detail_profile_splits_a_tasks_start():
    # a detail profile's stamps 6-8 split a task's start: header arrived, wait entered, the wait's table
    # fields arrived; the acquire is averaged over the waits whose producers had all ended by then
    import types

    import torch

    from kogc.frontend import to_ir
    from kogc.runtime.profile import format_summary, summarize
    from kogc.scheduler import build_schedule
    from kogc.targets import H200

    import micro_laneformer
    schedule = build_schedule(to_ir(micro_laneformer.kogc_model("micro", device="meta", seed=None)), H200,
                              num_programs=4)
    prof = torch.zeros((4, max(len(q) for q in schedule.queues), 9), dtype=torch.int64)
    late = 0
    for p, q in enumerate(schedule.queues):     # each task starts 3 us after the task before it by id
        for i, tid in enumerate(q):
            s = 1_000_000 + tid * 3000
            late_here = any(t > tid for g, _ in schedule.tasks[tid].waits for t in schedule.events[g].tasks)
            late += late_here
            prof[p, i] = torch.tensor([s, s + 1000, s + 3000, 0, 0, 0, s + 100, s + 300, s + 600])
    assert late == 0        # (task ids are in dependency order: every wait is ready by its fields)
    summary = summarize(types.SimpleNamespace(schedule=schedule, buffers=types.SimpleNamespace(PROF=prof)))
    for k, v in summary["per_kind"].items():
        d = v["start_us_mean"]
        assert d["ready_share"] == 1.0
        assert all(abs(d[f] - want) < 1e-9 for f, want in
                   (("header", 0.1), ("issue", 0.2), ("fields", 0.3), ("acquire", 0.4))), (k, d)
    # a producer that ends after the fields arrived: that wait is not ready and leaves the acquire's mean
    tid = next(t for t in range(len(schedule.tasks)) if schedule.tasks[t].waits)
    g = schedule.tasks[tid].waits[0][0]
    p, i = next((p, q.index(t)) for p, q in enumerate(schedule.queues) for t in schedule.events[g].tasks if t in q)
    prof[p, i, 2] = 1_000_000 + tid * 3000 + 800
    k = schedule.tasks[tid].kind_key
    summary = summarize(types.SimpleNamespace(schedule=schedule, buffers=types.SimpleNamespace(PROF=prof)))
    assert summary["per_kind"][k]["start_us_mean"]["ready_share"] < 1.0
    assert abs(summary["per_kind"][k]["start_us_mean"]["acquire"] - 0.4) < 1e-9
    assert "start (detail)" in format_summary(summary)


@pytest.mark.gpu
def test_bench_profiles_the_kernel_it_times_with_its_schedule(tmp_path, capsys, monkeypatch):
    """`kogc bench --profile --task-times FILE`: the profiled kernel takes the timed kernel's schedule (built
    once), the file names each task's kind, and kogc predict reads its bodies."""
    from kogc.analysis.stamps import load_kinds, load_profiled
    from kogc.scheduler import schedule as schedule_mod
    built = []
    real = schedule_mod._build_schedule
    monkeypatch.setattr(schedule_mod, "_build_schedule", lambda *a: built.append(1) or real(*a))
    f = str(tmp_path / "t.npz")
    assert main(["bench", MODEL_FILE, "--config", "tiny", "--context", "16", "--steps", "4", "--reps", "1",
                 "--baselines", "", "--profile", "--task-times", f]) == 0
    assert "step span" in capsys.readouterr().out and len(built) == 1
    s, ids, _, _ = load_profiled(f)
    assert load_kinds(f) == [s.tasks[int(t)].kind_key for t in ids]
    assert main(["predict", MODEL_FILE, "--config", "tiny", "--gpus", "1", "--bodies", f]) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("how, label", [("--one-gpu", "kogc 2 ranks"), ("--mirror", "kogc rank 0 of 2, mirrored")])
def test_bench_of_ranks_checks_them_and_the_one_gpu_kernel_against_eager(tmp_path, capsys, how, label):
    """`kogc bench --gpus 2` with both ranks on this GPU, or rank 0 with its peers mirrored (checked on the model
    it computes, rank 0's lane groups copied, on rank 0's vocabulary shard; the one-GPU kernel on that model too):
    before timing, one step of the ranks and one of the one-GPU kernel are checked against eager, and the
    command's exit code says whether they passed."""
    out = tmp_path / "ranks.json"
    rc = main(["bench", MODEL_FILE, "--config", "tiny", "--gpus", "2", how, "--context", "16", "--steps", "4",
               "--reps", "1", "--json", str(out)])
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert set(res["checks"]) == {label, "kogc 1 GPU"}
    assert rc == 0 and res["passed"], text
    assert all(c["rel_err"] < 1e-4 and c["token"] == c["eager_token"] for c in res["checks"].values())
    assert f"{label} against eager at position 16: rel err" in text


def test_a_16_bit_step_missing_the_limit_is_decided_by_an_fp32_copy():
    # where eager fp16 is the noisier side, logits nearer an fp32 copy of the same weights and cache than eager's
    # pass with their token; logits farther from it than eager's, or another token, fail
    import copy

    from conftest import tiny

    from kogc.bench.against_eager import _eager_step, format_check, fp32_verdict
    from kogc.frontend import to_ir
    from kogc.runtime.kernel import kv_cache_buffers, randomize_kv
    model = tiny(seed=3, dtype=torch.float16)
    randomize_kv(kv_cache_buffers(to_ir(model), model), 5, torch.Generator().manual_seed(3))
    eager, _ = _eager_step(model, 5, "cpu", 0)
    ref32, _ = _eager_step(copy.deepcopy(model).float(), 5, "cpu", 0)
    assert 0 < float((eager - ref32).norm()) and eager.dtype == torch.float32
    top = int(ref32.argmax())
    near = fp32_verdict(model, 5, "cpu", 0, ref32 + 0.1 * (eager - ref32), top, eager, torch.float16)
    assert near["ok"] and near["kogc_rel_err"] < near["eager_rel_err"], near
    far = fp32_verdict(model, 5, "cpu", 0, ref32 + 3 * (eager - ref32), top, eager, torch.float16)
    assert not far["ok"] and far["kogc_rel_err"] > far["eager_rel_err"], far
    other = int(ref32.argmin())
    assert fp32_verdict(model, 5, "cpu", 0, ref32, other, eager, torch.float16)["argmax_miss"] is not None
    line = format_check("kogc", {"position": 5, "rel_err": 0.03, "limit": 1e-2, "token": top, "eager_token": top,
                                 "argmax_miss": None, "ok": True, "fp32": near})
    assert "against an fp32 copy kogc" in line and line.endswith(": ok")

"""`kogc inspect`: a build folder's summary, one task, one queue, one layer's graph; a profile's timeline
PNG, Perfetto trace and roofline table; --diff of builds and of profiles; bad input (exit 2, one line)."""
import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import MODEL_FILE, ROOT

from kogc.analysis import load_stamps, longest_path, schedule_for
from kogc.cli import main
from kogc.codegen.variants import format_variant_table
from kogc.inspection import (as_scheduled, chain, decode_task, load_build, load_profile, roofline, task_us, timeline,
                             timeline_size, trace_events)
from kogc.inspection.costs import feeds

PROFILE = os.path.join(ROOT, "tests", "data", "tiny-profile.npz")   # an H200, kogc bench --config tiny --context 64
PROFILED = '{"lane_group_stagger": 2.0}'   # the placement setting that profile ran with (its record holds every
                                            # setting; the default has changed since)


def _compile(out, *extra):
    assert main(["compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--out", str(out), *extra]) == 0


def _schedule_only(out, tile_config: str):
    """A build folder as `kogc compile --out` writes it, less its binary (what --diff reads of the
    second build: compiling it would cost the suite ~25 s)."""
    from kogc.settings import tile_config_for
    from kogc.codegen.render import render
    from kogc.frontend import to_ir
    from kogc.frontend.model_file import build_model
    from kogc.ir import to_text
    from kogc.scheduler import build_schedule
    from kogc.scheduler.config import tile_config_from_json
    from kogc.targets import H200
    model = build_model(MODEL_FILE, preset="tiny", device="meta", seed=None)
    graph = to_ir(model)
    s = build_schedule(graph, H200, tile_config=tile_config_for(model, H200, tile_config_from_json(tile_config)))
    for name, text in (("ir.txt", to_text(graph, sources=True)), ("schedule.json", s.to_json()),
                       ("report.txt", s.report() + "\n"), ("kernel.py", render(s))):
        (out / name).write_text(text)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Two tiny builds: the stored profile's schedule (compiled, each code variant also alone:
    --per-variant) and the same with 4 attention splits."""
    a, b = tmp_path_factory.mktemp("tiny"), tmp_path_factory.mktemp("tiny-splits4")
    _compile(a, "--per-variant", "--tile-config", PROFILED)
    _schedule_only(b, json.dumps({**json.loads(PROFILED), "attn_splits": 4}))
    return str(a), str(b)


@pytest.fixture(scope="module")
def schedule():
    """The schedule the build and the profile hold, built the way kogc analyze builds it."""
    return schedule_for({"model_file": MODEL_FILE, "config": "tiny", "target": "h200"}, tile_config=PROFILED)


@pytest.fixture(scope="module")
def profiled(builds):
    return load_profile(PROFILE, load_build(builds[0]))


def run(capsys, *argv):
    rc = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_build_is_the_schedule(builds, schedule):
    ins = load_build(builds[0])
    s = ins.schedule
    assert s.queues == schedule.queues and s.variants == schedule.variants
    for t, u in zip(s.tasks, schedule.tasks):
        assert (t.op, t.lane, t.layer, t.group, t.waits, t.cost_bytes) == (u.op, u.lane, u.layer, u.group, u.waits,
                                                                           u.cost_bytes)
    assert [e.tasks for e in s.events] == [e.tasks for e in schedule.events]
    us = task_us(ins)
    # as scheduled with the bytes model is the placement's own estimate; the chain through the waits is
    # the chain over the exact producers (Task.deps, which schedule.json does not hold)
    assert as_scheduled(ins, us)[0] == pytest.approx(schedule.est_seconds * 1e6)
    assert chain(ins, us)["us"] == pytest.approx(longest_path(schedule, us, ins.latency_us, False)[0])


def test_summary(builds, schedule, capsys):
    rc, out, _ = run(capsys, builds[0])
    assert rc == 0
    assert re.search(r"^attention\s+192\s", out, re.M) and re.search(r"^all\s+274\s", out, re.M)
    assert "per program" in out and "predicted busy us" in out
    m = re.search(r"step as scheduled ([\d.]+) us \(the placement's estimate: (\d+) us", out)
    assert abs(float(m.group(1)) - float(m.group(2))) <= 1
    layers = re.findall(r"^\s+(\d+|tail)\s+\d+\s", out.split("per layer")[1], re.M)
    assert layers[:4] == ["0", "1", "2", "tail"]
    assert "registers 168" in out and "code variants (variants.txt" in out


def test_per_variant_build(builds, schedule, capsys):
    # `kogc compile --out --per-variant`: the kernel, its reports, and one kernel per code variant, each
    # with only that body in its dispatch (so it names only its own variant id), and a table with a row
    # per variant; refused without --out
    from kogc.codegen.render import render
    out = Path(builds[0])
    assert main(["compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--per-variant"]) == 2
    assert "--out" in capsys.readouterr().err
    kernel = out / "sm_90" / "kogc_monokernel.cubin"     # the whole kernel too
    assert kernel.read_bytes()[:4] == b"\x7fELF" and kernel.stat().st_size > 10_000
    for name in ("kernel.py", "schedule.json", "report.txt", "ir.txt"):
        assert (out / name).stat().st_size > 0
    s = schedule
    rows = (out / "variants.txt").read_text().splitlines()[1:]
    assert len(rows) == len(s.variants)
    for i, v in enumerate(s.variants):
        assert rows[i].split()[0] == str(i) and rows[i].endswith("/".join(map(str, v)))
        assert int(rows[i].split()[1]) > 0                                      # registers
        assert (out / "variants" / str(i) / "kogc_monokernel.cubin").stat().st_size > 1000
        src = (out / "variants" / f"{i}.py").read_text()
        assert f"variant == {i}:" in src and src.count("variant == ") == 1
    assert render(s).count("variant == ") == len(s.variants)
    assert render(s, only_variant=(0, 2)).count("variant == ") == 2
    with pytest.raises(ValueError, match="only_variant"):
        render(s, only_variant=len(s.variants))


def test_variants_table_and_kind_us(builds, tmp_path, capsys):
    d = tmp_path / "b"
    d.mkdir()
    for f in ("schedule.json", "report.txt", "ir.txt"):
        shutil.copy(os.path.join(builds[0], f), d / f)
    ins = load_build(str(d))
    rows = [{"id": i, "variant": v, "registers": 100 + i, "spill_store_bytes": 0, "bar_sync": 3, "st_global": 2,
             "ld_global_bits": {128: 4}} for i, v in enumerate(ins.schedule.variants)]
    (d / "variants.txt").write_text(format_variant_table(rows) + "\n")
    rc, out, _ = run(capsys, str(d))
    assert rc == 0 and "code variants (variants.txt" in out
    attention = ins.schedule.variants.index(next(t.variant for t in ins.schedule.tasks if t.kind == "attention"))
    assert re.search(rf"^\s+{attention}\s+{100 + attention}\s+0\s+192\s+attention/", out, re.M)
    # other task times than the placement's: the step moves and a note says so
    rc, out, _ = run(capsys, str(d), "--kind-us", '{"attention": 20.0}')
    assert rc == 0 and "measured times of 1 kinds" in out and "note: the placement estimated" in out


def test_task_decodes_the_schedules_waits(builds, schedule, capsys):
    ins = load_build(builds[0])
    waiters = feeds(schedule)
    for t in schedule.tasks:
        text = decode_task(ins, t.id)
        waits = [(int(g), int(n)) for g, n in re.findall(r"^\s+event (\d+) \S+: needs (\d+)", text, re.M)]
        assert waits == [tuple(w) for w in t.waits]
        fed = re.search(r"feeds (\d+) tasks?", text)
        assert (int(fed.group(1)) if fed else 0) == len(waiters.get(t.group, []))
    rc, out, _ = run(capsys, builds[0], "--task", "2")
    t = schedule.tasks[2]
    assert rc == 0 and out.startswith(f"task 2: matvec/rmsnorm/rope_store, lane {t.lane}, layer {t.layer}")
    assert f"op {t.op} = matvec(" in out and "laneformer.py:" in out and "weight tile model.layers.0" in out


def test_program_and_layer(builds, schedule, tmp_path, capsys):
    p = max(range(len(schedule.queues)), key=lambda i: len(schedule.queues[i]))
    rc, out, _ = run(capsys, builds[0], "--program", str(p))
    lines = out.strip().splitlines()
    assert rc == 0 and len(lines) == 2 + len(schedule.queues[p])
    assert [int(x.split()[1]) for x in lines[2:]] == schedule.queues[p]
    svg, dot = tmp_path / "l1.svg", tmp_path / "l1.dot"
    rc, out, err = run(capsys, builds[0], "--layer", "1", "--graph", str(svg))
    assert rc == 0 and out.startswith("layer 1: 88 tasks in 16 groups") and svg.read_text().lstrip().startswith("<?xml")
    assert run(capsys, builds[0], "--layer", "1", "--graph", str(dot))[0] == 0
    text = dot.read_text()
    assert text.startswith("digraph") and text.count("->") == int(re.search(r"(\d+) edges", err).group(1))


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_timeline_png(profiled, tmp_path, capsys):
    ins, prof = profiled
    png = tmp_path / "t.png"
    info = timeline(ins, prof, str(png), width_px=1200, row_px=4)
    P = len(ins.schedule.queues)
    # one row per program: a tick at each row's centre, the rows filling the axes
    assert info["rows"] == list(range(P)) and info["row_ticks"] == list(range(P)) and info["ylim"] == (P - 0.5, -0.5)
    assert _png_size(png) == info["size"] == timeline_size(P, 1200, 4)
    assert info["bars"] == np.count_nonzero(prof.ts[:, 1] > prof.ts[:, 0]) + len(prof.ids)
    # each program's first task: its body is drawn on its own row
    import matplotlib.image
    from kogc.inspection.plots import MARGIN_PX as M
    img = matplotlib.image.imread(str(png))
    axw = 1200 - M["left"] - M["right"]
    for p, q in enumerate(ins.schedule.queues):
        if q:
            _, b, c = prof.ts[prof.row[q[0]], :3] / 1e3
            x = int(M["left"] + (b + c) / 2 / prof.span_us * axw)
            y = int(M["top"] + (p + 0.5) * 4)
            assert img[y, x, :3].min() < 0.95, f"program {p}: nothing drawn at ({x}, {y})"
    # the command line, zoomed
    rc, _, err = run(capsys, ins.where, "--profile", PROFILE, "--png", str(png), "--programs", "10:30",
                     "--window", "0:20")
    assert rc == 0 and _png_size(png) == timeline_size(20) and "20 programs" in err


def test_trace_and_roofline(builds, profiled, tmp_path, capsys):
    ins, prof = profiled
    path = tmp_path / "t.json"
    rc, out, err = run(capsys, builds[0], "--profile", PROFILE, "--trace", str(path), "--context", "64")
    assert rc == 0 and "roofline" in out and "ui.perfetto.dev" in err
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    tracks = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    P = len(ins.schedule.queues)
    assert len(slices) == 2 * len(ins.schedule.tasks) and sorted(e["tid"] for e in tracks) == list(range(P))
    prog = {tid: p for p, q in enumerate(ins.schedule.queues) for tid in q}
    assert all(e["tid"] == prog[e["args"]["task"]] for e in slices)
    assert all(e["dur"] >= 0 for e in slices)
    r = roofline(ins, prof, context=64)
    assert sum(x["tasks"] for x in r["rows"]) == len(ins.schedule.tasks)
    assert r["wait_share"] + r["body_share"] + r["idle_share"] == pytest.approx(1.0)
    assert trace_events(ins, prof, range(5, 7))["traceEvents"][-1]["tid"] in (5, 6)


def test_profile_without_build(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)          # the profile records its model file relative to the repository
    rc, out, err = run(capsys, "--profile", PROFILE, "--task", "100")
    assert rc == 0 and "measured: start" in out and "rebuilding" in err


def test_diff(builds, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, out, _ = run(capsys, "--diff", builds[0], builds[0])
    assert rc == 0 and out.rstrip().endswith("differences: none")
    rc, out, _ = run(capsys, "--diff", builds[0], builds[1])
    assert rc == 0 and "differences: none" not in out
    assert re.search(r"^\s+attention\s+192\s+48\s+-144 \*$", out, re.M)
    rc, out, _ = run(capsys, "--diff", PROFILE, PROFILE)
    assert rc == 0 and re.search(r"^\s+span\s+[\d.]+\s+[\d.]+\s+0$", out, re.M) and "differences: none" in out


@pytest.mark.parametrize("argv, words", [
    (["{tmp}"], "not a kogc build folder"),
    (["{tmp}/nowhere"], "no such build folder"),
    (["{a}", "--task", "274"], "--task 274 is out of range"),
    (["{a}", "--program", "-1"], "--program -1 is out of range"),
    (["{a}", "--layer", "3"], "--layer 3 is out of range"),
    (["{b}", "--profile", PROFILE], "profile of another schedule"),
    (["{a}", "--png", "{tmp}/x.png"], "--png needs a profile"),
    (["{a}", "--profile", PROFILE, "--programs", "0:999"], "--programs 0:999"),
    (["--diff", "{a}", PROFILE], "two builds or two profiles"),
    (["{a}", "--graph", "{tmp}/x.svg"], "give --layer"),
])
def test_bad_input(builds, tmp_path, capsys, argv, words):
    argv = [x.format(tmp=tmp_path, a=builds[0], b=builds[1]) for x in argv]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("kogc: error: ") and words in err


def test_without_matplotlib(builds, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # `import matplotlib` raises ImportError
    rc, out, err = run(capsys, builds[0], "--profile", PROFILE, "--png", str(tmp_path / "t.png"))
    assert rc == 2 and out == "" and err == "kogc: error: the timeline (--png) needs matplotlib: pip install " \
                                            "'kogc[inspect]'\n"
    rc, _, _ = run(capsys, builds[0], "--layer", "0", "--graph", str(tmp_path / "g.dot"))   # DOT needs no matplotlib
    assert rc == 0


def test_stored_profile_is_the_tiny_schedule(schedule):
    ids, _, meta = load_stamps(PROFILE)
    assert meta["config"] == "tiny" and len(ids) == len(schedule.tasks)


def test_a_build_records_the_placements_task_times(tmp_path):
    # schedule.json carries the settings: inspect's cost model is the one the placement used
    kind_us = {"attention": 7.5, "matvec/rmsnorm/store": 1.25}
    _compile(tmp_path, "--tile-config", json.dumps({"kind_us": kind_us}))
    recorded = json.loads((tmp_path / "schedule.json").read_text())["tile_config"]
    assert recorded["kind_us"] == kind_us and recorded["attn_splits"] == 16
    ins = load_build(str(tmp_path))
    assert ins.kind_us == kind_us and ins.kind_us_known


def test_proton_probe_needs_a_gpu(tmp_path, capsys):
    # the probe of Proton against kogc's timestamps (docs/inspect.md) runs on an NVIDIA GPU only
    import torch
    from kogc.bench import proton_probe
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe would run")
    assert proton_probe.main(["--out", str(tmp_path)]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


def test_a_build_with_shared_lane_events(tmp_path, capsys):
    """A build whose residual tasks also count on their op's event over all lanes (four lanes: a residual
    waits on several lanes' delayed terms): it loads, a task shows both events it publishes, and the replay as
    scheduled starts every task after all producers of each event it waits on (the shared ones included)."""
    _compile(tmp_path, "--lanes", "4")
    ins = load_build(str(tmp_path), machine_code=False)
    s = ins.schedule
    sharing = [t for t in s.tasks if t.publish_too >= 0]
    assert sharing, "no shared lane event in this build"
    rc, out, _ = run(capsys, str(tmp_path), "--task", str(sharing[0].id))
    assert rc == 0
    assert out.count("publishes event") == 2 and "all lanes" in out
    us = [1.0 + (t.id % 7) * 0.3 for t in s.tasks]
    _, end = as_scheduled(ins, us)
    for t in s.tasks:
        for g, _ in t.waits:
            assert end[t.id] - us[t.id] >= max(end[i] for i in s.events[g].tasks) + ins.latency_us - 1e-9


def test_a_build_of_several_ranks_points_at_one(tmp_path, capsys):
    # kogc compile --gpus G --out DIR writes DIR/rank0 .. rankG-1: inspecting DIR names the way in
    for r in (0, 1):
        (tmp_path / f"rank{r}").mkdir()
    rc, _, err = run(capsys, str(tmp_path))
    assert rc == 2 and "a build of 2 ranks" in err and os.path.join(str(tmp_path), "rank0") in err

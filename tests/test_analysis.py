"""kogc.analysis and `kogc analyze`: replays of a schedule with measured task times (as scheduled, the
chain, perfect balance, with overheads), the chain's make-up, a layer's phases; task-times files."""
import dataclasses
import json
import types

import numpy as np
import pytest
from conftest import MODEL_FILE, tiny

from kogc.analysis import (PHASES, body_us, chain_composition, first_layers, layer_phases, load_stamps, longest_path,
                           measured_overheads, save_stamps, schedule_for, tail_spans, weight_rate)
from kogc.analysis.stamps import record_read_bandwidth
from kogc.analysis.phases import PHASE_OF, TAIL_KINDS
from kogc.cli import main
from kogc.frontend import to_ir
from kogc.runtime.profile import kind_key
from kogc.scheduler import build_schedule
from kogc.scheduler.check import run_order
from kogc.scheduler.config import ESIZE
from kogc.targets import get_target

META = {"model_file": MODEL_FILE, "config": "tiny", "num_programs": 4, "target": "h200", "overrides": {}}


@pytest.fixture(scope="module")
def parallel():
    return build_schedule(to_ir(tiny(num_lanes=2)), get_target("h200"), "parallel", num_programs=8)


@pytest.fixture(scope="module")
def sequential():
    return build_schedule(to_ir(tiny(num_lanes=2, num_hidden_layers=4)), get_target("h200"), "sequential")


def played(schedule, body_ns=2000, notify_ns=500, table_ns=200):
    """A timeline by the kernel's rules: a task starts when its program's previous task ends, its waits
    end `notify_ns` after the last producer it waits on ended (or its start, if later; `table_ns` after
    its start without waits), its body takes `body_ns` (+ 100 ns per id mod 3). (ids, ts) in queue order."""
    prog = {tid: p for p, q in enumerate(schedule.queues) for tid in q}
    last, done, rows = {}, {}, {}
    for tid in run_order(schedule.tasks, schedule.events, schedule.queues):
        t = schedule.tasks[tid]
        start = last.get(prog[tid], 0)
        ready = max((done[g] for g, _ in t.waits), default=None)
        after = max(start, ready) + notify_ns if ready is not None else start + table_ns
        end = after + body_ns + 100 * (tid % 3)
        rows[tid] = (start, after, end)
        last[prog[tid]] = end
        done[t.group] = max(done.get(t.group, 0), end)
    ids = np.array([tid for q in schedule.queues for tid in q])
    return ids, np.array([rows[tid] for tid in ids], dtype=np.int64)


def test_one_queue_takes_the_sum_of_its_tasks(sequential):
    s = sequential
    ones = [1.0] * len(s.tasks)
    assert longest_path(s, ones, 0.0, queues=True)[0] == len(s.tasks)
    # a wait adds the latency only where it delays a task: at most once per task
    assert len(s.tasks) <= longest_path(s, ones, 0.5, queues=True)[0] <= len(s.tasks) * 1.5
    per_task = [0.5 + (t.id % 3) for t in s.tasks]
    assert longest_path(s, per_task, 0.0, queues=True)[0] == sum(per_task)


def test_bounds_are_ordered(parallel):
    s = parallel
    dur = [1.0 + 0.1 * len(kind_key(t)) for t in s.tasks]
    sched, latest = longest_path(s, dur, 1.0, queues=True)
    chain, _ = longest_path(s, dur, 1.0, queues=False)
    assert chain <= sched and sum(dur) / len(s.queues) <= sched
    assert max(latest.values()) == sched == latest["argmax"]      # the step ends with its token


def test_chain_composition_adds_up(parallel):
    s = parallel
    dur = [1.0 + (t.id % 5) * 0.25 for t in s.tasks]
    c = chain_composition(s, dur, 0.5)
    chain, _ = longest_path(s, dur, 0.5, queues=False)
    assert abs(c["chain_us"] - chain) < 1e-9
    assert abs(c["hop_us_total"] + sum(v["us"] for v in c["per_kind"].values()) - chain) < 1e-9
    assert c["per_kind"]["embed"]["tasks"] == 1 and c["per_kind"]["argmax"]["tasks"] == 1


def test_replay_with_overheads(parallel):
    # no overheads: the plain in-order replay; overheads only delay, and a program's tasks take at
    # least the sum of their overheads and bodies
    s = parallel
    dur = [1.0 + (t.id % 5) * 0.25 for t in s.tasks]
    plain, _ = longest_path(s, dur, 0.5, queues=True)
    assert abs(longest_path(s, dur, 0.5, True, [0.0] * len(dur))[0] - plain) < 1e-9
    over = [1.5 if t.waits else 0.25 for t in s.tasks]
    slower = longest_path(s, dur, 0.5, True, over)[0]
    assert slower > plain and slower >= max(sum(dur[t] + over[t] for t in q) for q in s.queues)


def test_a_played_timeline_is_replayed_exactly(parallel):
    # the timeline follows the replay's own rules: the measured overheads are the table reads of
    # tasks without waits (0.2 us), a ready wait's 0.5 us for tasks with waits, the notify 0.5 us, and
    # the replay with them gives the measured span
    s = parallel
    ids, ts = played(s)
    over, notify = measured_overheads(s, ids, ts)
    assert notify == pytest.approx(0.5)
    assert all(o == pytest.approx(0.2) for o, t in zip(over, s.tasks) if not t.waits)
    with_waits = [o for o, t in zip(over, s.tasks) if t.waits]
    assert sum(o == pytest.approx(0.5) for o in with_waits) > len(with_waits) / 2
    span = float(ts[:, 2].max() - ts[:, 0].min()) / 1e3
    assert longest_path(s, body_us(s, ids, ts), notify, True, over)[0] == pytest.approx(span, rel=0.02)


def test_a_detail_profile_replays_its_table_reads_free(parallel):
    # a detail profile's stamp 8 (the wait's table fields arrived) 0.1 us after every start: the replay
    # also removes that part of each start alone, which lands between the measured starts and none
    from kogc.analysis import format_replay, replay
    s = parallel
    ids, ts = played(s)
    assert "table_free_us" not in replay(s, ids, ts, [0.5])["with_overheads"]
    detail = np.zeros((len(ids), 9), dtype=np.int64)
    detail[:, :3] = ts
    detail[:, 6:9] = ts[:, :1] + np.array([20, 60, 100])
    r = replay(s, ids, detail, [0.5])
    w = r["with_overheads"]
    assert w["table_per_program_us"] == pytest.approx(np.mean([0.1 * len(q) for q in s.queues]))
    none = {(x["overhead_scale"], x["notify_scale"]): x["as_scheduled_us"] for x in w["whatif"]}[(0.0, 1.0)]
    assert none < w["table_free_us"] < w["as_scheduled_us"]
    assert "table reads alone" in format_replay(r)


def test_phases_add_up_to_the_layer(sequential):
    # one queue back to back, every task 0.5 us of wait then 1 us of body: each phase's body is 1 us,
    # its task count the schedule's, and the phases span a whole layer (last W2 to last W2)
    s = sequential
    ids = np.array(s.queues[0])
    ts = np.array([[k * 1500, k * 1500 + 500, k * 1500 + 1500] for k in range(len(ids))], dtype=np.int64)
    phases = layer_phases(s, ids, ts)
    assert [r["phase"] for r in phases] == list(PHASES)
    assert all(abs(r["body"] - 1.0) < 1e-9 for r in phases)
    per_lane = {p: sum(1 for t in s.tasks if t.lane == 0 and t.layer == 1 and PHASE_OF.get(kind_key(t)) == p)
                for p in PHASES}
    assert {r["phase"]: r["tasks"] for r in phases} == per_lane
    end = {int(tid): ts[j, 2] / 1e3 for j, tid in enumerate(ids)}
    w2 = {}
    for t in s.tasks:
        if t.layer is not None and PHASE_OF.get(kind_key(t)) == "W2":
            w2[(t.lane, t.layer)] = max(w2.get((t.lane, t.layer), 0.0), end[t.id])
    layer_us = np.mean([w2[(lane, layer)] - w2[(lane, layer - 1)] for lane in (0, 1) for layer in (1, 2)])
    assert abs(sum(r["span"] for r in phases) - layer_us) < 1e-9
    # bytes: the phase's tasks' cost bytes in one (lane, layer); all lanes' at the target's read bandwidth
    def hbm(t):
        return t.weight.nbytes if t.weight is not None else t.cost_bytes if t.kind == "attention" else 0
    mb = {p: sum(hbm(t) for t in s.tasks if t.lane == 0 and t.layer == 1 and PHASE_OF.get(kind_key(t)) == p) / 1e6
          for p in PHASES}
    assert all(mb.values())
    assert {r["phase"]: r["MB"] for r in phases} == pytest.approx(mb)
    assert [r["floor_us"] for r in phases] == pytest.approx([mb[p] * 2e12 / s.target.hbm_read_bw for p in PHASES])
    # a run's own bandwidth reading, where given, in place of the target's figure
    measured = layer_phases(s, ids, ts, read_bw_Bps=3e12)
    assert [r["floor_us"] for r in measured] == pytest.approx([mb[p] * 2e12 / 3e12 for p in PHASES])


def test_first_layers_weight_rate_and_tail(sequential):
    s = sequential
    ids = np.array(s.queues[0])
    ts = np.array([[k * 1500, k * 1500 + 500, k * 1500 + 1500] for k in range(len(ids))], dtype=np.int64)
    rows = first_layers(s, ids, ts, 2)
    assert {r["layer"] for r in rows} == {0, 1}
    for r in rows:
        ks = [k for k, tid in enumerate(ids) if s.tasks[tid].layer == r["layer"]
              and PHASE_OF.get(kind_key(s.tasks[tid])) == r["phase"]]
        assert r["start"] == ks[0] * 1.5 and r["end"] == ks[-1] * 1.5 + 1.5
    rate = weight_rate(s, ids, ts, len(ids) * 1.5 + 5, width_us=5.0)      # every tile counted once
    total = sum(t.weight.numel for t in s.tasks if t.weight) * ESIZE[s.dtype]
    assert abs(sum(x * 5e-6 * 1e12 for x in rate) - total) < 1e-3 * total
    spans = tail_spans(s, ids, ts)
    assert set(spans) == set(TAIL_KINDS)
    where = {k: [j for j, tid in enumerate(ids) if kind_key(s.tasks[tid]) == k] for k in TAIL_KINDS}
    assert all(spans[k] == (where[k][0] * 1.5, where[k][-1] * 1.5 + 1.5) for k in TAIL_KINDS)


def played_stamps(s, path: str, stamps_schedule=None, **record) -> tuple[str, np.ndarray, np.ndarray]:
    """A task-times file as kogc bench / sweep write it (save_stamps) for schedule `s`, with a played
    timeline (of `stamps_schedule`, default s) in place of a GPU's stamps: (its path, ids, stamps)."""
    ids, ts = played(stamps_schedule or s)
    prof = np.zeros((len(s.queues), max(len(q) for q in s.queues), 3), dtype=np.int64)
    j = 0
    for p, q in enumerate(s.queues):
        prof[p, :len(q)] = ts[j:j + len(q)] + 1_000_000          # absolute, as the kernel records them
        j += len(q)
    ck = types.SimpleNamespace(schedule=s, buffers=types.SimpleNamespace(PROF=types.SimpleNamespace(
        cpu=lambda: types.SimpleNamespace(numpy=lambda: prof))))
    if stamps_schedule is not None:         # as mirror_rank's kernel holds it
        ck.stamps_schedule = stamps_schedule
    return save_stamps(ck, path, **record), ids, ts


@pytest.fixture(scope="module")
def stamps_file(tmp_path_factory):
    """A task-times file for tiny on 4 programs (played_stamps)."""
    s = schedule_for(META)
    path, ids, ts = played_stamps(s, str(tmp_path_factory.mktemp("stamps") / "task-times"), model_file=MODEL_FILE,
                                  preset="tiny")
    return path, s, ids, ts


def test_stamps_round_trip(stamps_file):
    path, s, ids, ts = stamps_file
    assert path.endswith(".npz")
    got_ids, got_ts, meta = load_stamps(path)
    assert (got_ids == ids).all() and (got_ts == ts).all()
    assert meta["config"] == "tiny" and meta["num_programs"] == 4 and meta["target"] == "h200"
    assert meta["tasks"] == len(s.tasks)
    # every setting is recorded, not only those that differ from the defaults: a file stays readable
    # after a default changes
    assert meta["tile_config"] == dataclasses.asdict(s.tile_config)
    assert schedule_for(meta).queues == s.queues
    assert meta["device"] is None and "read_bw_Bps" not in meta      # a datasheet target; no reading given
    # the bench's floor takes the higher of its readings, the second after the file was written: it sets it then
    record_read_bandwidth(path, 4.1e12)
    got_ids, got_ts, again = load_stamps(path)
    assert again == {**meta, "read_bw_Bps": 4.1e12} and (got_ids == ids).all() and (got_ts == ts).all()


def test_a_file_names_its_tasks_kinds_so_that_its_bodies_read_without_the_schedule(stamps_file, tmp_path):
    """kogc predict --bodies: a file's bodies by kind, from the kinds it records, also once its kernel has
    changed (its schedule no longer fits); a file without kinds is read through its schedule."""
    from kogc.analysis.stamps import _write, bodies_of_file, load_kinds, load_profiled
    from kogc.analysis.stream import bodies_by_kind
    from kogc.errors import KogcError
    path, s, ids, ts = stamps_file
    kinds = load_kinds(path)
    assert kinds == [s.tasks[int(t)].kind_key for t in ids] and len(set(kinds)) > 3

    def by_kind(per):
        return {k: sorted(v) for k, v in per.items()}
    want = by_kind(bodies_by_kind(s, ids, ts))
    assert by_kind(bodies_of_file(path)) == want
    got_ids, got_ts, meta = load_stamps(path)
    stale = str(tmp_path / "stale.npz")                 # as if compiled by a kernel of another day
    _write(stale, got_ids, got_ts, {**meta, "num_programs": 3}, np.load(path)["kind"])
    with pytest.raises(KogcError, match="not the schedule the profile was taken with"):
        load_profiled(stale)
    assert by_kind(bodies_of_file(stale)) == want
    record_read_bandwidth(stale, 4.0e12)                # rewritten with its kinds
    assert load_kinds(stale) == kinds
    old = str(tmp_path / "old.npz")                     # written before files held kinds
    _write(old, got_ids, got_ts, {k: v for k, v in meta.items() if k != "kinds"})
    assert load_kinds(old) is None and by_kind(bodies_of_file(old)) == want


def test_a_recorded_config_is_read_as_compiled_not_filled_from_todays_profile():
    # a file's meta records the settings its compile used, the profile of that day filled in; a profile that
    # gained settings since (laneformer-2b's four lane homes) must not move the file's queues: what the record
    # leaves unset (lane_homes absent: the rule's, as then) takes the defaults. A config given, or none recorded,
    # is placed as kogc.compile places it today.
    import laneformer as lf
    from kogc.analysis.stamps import recorded_config
    from kogc.scheduler import TileConfig
    from kogc.settings import tile_config_for
    from kogc.targets import H200
    model = lf.kogc_model("laneformer-2b", device="meta", seed=None)
    then = {"tile_bytes": 32768, "lane_group_stagger": 2.0, "cost_context": 1024, "place_latency_us": 1.0,
            "kind_us": {"attention": 5.48}}
    cfg = recorded_config({"tile_config": then}, model, H200)
    assert (cfg.lane_homes, cfg.lane_group_stagger, cfg.cost_context, cfg.kind_us) == (0, 2.0, 1024, then["kind_us"])
    assert recorded_config({}, model, H200) == tile_config_for(model, H200) != cfg
    assert recorded_config({}, model, H200).lane_homes == 4
    given = recorded_config({"tile_config": then}, model, H200, '{"lane_group_stagger": 2.0}')
    assert given == tile_config_for(model, H200, TileConfig(lane_group_stagger=2.0))
    assert recorded_config({"mirror_of": 8}, model, H200) == tile_config_for(model, H200, gpus=8)


def test_phases_hold_the_bytes_against_the_runs_bandwidth(tmp_path, capsys):
    # a file that records its run's bandwidth reading (kogc bench, sweep): kogc analyze phases uses it and says
    # so; without one, the target's figure, also said
    s = schedule_for(META)
    with_bw, _, _ = played_stamps(s, str(tmp_path / "bw"), model_file=MODEL_FILE, preset="tiny", read_bw_Bps=2.5e12)
    assert load_stamps(with_bw)[2]["read_bw_Bps"] == 2.5e12
    without, _, _ = played_stamps(s, str(tmp_path / "plain"), model_file=MODEL_FILE, preset="tiny")
    floors = {}
    for name, path in (("bw", with_bw), ("plain", without)):
        out = tmp_path / f"{name}.json"
        assert main(["analyze", "phases", path, "--json", str(out)]) == 0
        floors[name] = [r["floor_us"] for r in json.loads(out.read_text())["phases"]]
        text = capsys.readouterr().out
        assert ("at 2.50 TB/s (us; the profiled run's reading)" in text) == (name == "bw"), text
    ratio = s.target.hbm_read_bw / 2.5e12
    assert floors["bw"] == pytest.approx([f * ratio for f in floors["plain"]]) and all(floors["plain"])


@pytest.mark.parametrize("what, expect", [
    ("replay", ["step span", "perfect balance", "as scheduled with the measured start overheads"]),
    ("chain", ["the chain at 0.5 us per hop", "argmax"]),
    ("phases", ["| QKV |", "| W2 |", "| layer |", "tail: argmax"]),
])
def test_analyze_command(stamps_file, tmp_path, capsys, what, expect):
    path = stamps_file[0]
    out = tmp_path / "a.json"
    assert main(["analyze", what, path, "--latency-us", "0.5,1", "--first-layers", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert all(e in text for e in expect), text
    res = json.loads(out.read_text())
    if what == "replay":
        assert [r["latency_us"] for r in res["rows"]] == [0.5, 1.0]
        assert res["with_overheads"]["as_scheduled_us"] == pytest.approx(res["measured_span_us"], rel=0.02)
        assert all(r["chain_us"] <= r["as_scheduled_us"] for r in res["rows"])
        # cheaper starts and hops never make the replay slower, and removing the starts saves time
        w = res["with_overheads"]
        by = {(x["overhead_scale"], x["notify_scale"]): x["as_scheduled_us"] for x in w["whatif"]}
        assert len(by) == 5 and w["overhead_per_program_us"] > 0
        assert by[(0.0, 0.5)] <= by[(0.0, 1.0)] <= by[(0.5, 1.0)] <= w["as_scheduled_us"] + 1e-9
        assert by[(0.0, 1.0)] < w["as_scheduled_us"]
        assert "overheads x0.0, notify x1.0" in text


def test_replay_with_one_kinds_bodies_scaled(stamps_file, tmp_path, capsys):
    """--scale-bodies F: every kind replayed with its bodies x F; shorter bodies never lengthen the step, and
    with no bodies at all for the kind on the step's end (the argmax) the step ends earlier."""
    path = stamps_file[0]
    out = tmp_path / "k.json"
    assert main(["analyze", "replay", path, "--scale-bodies", "0", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    w = json.loads(out.read_text())["with_overheads"]
    kinds = {x["kind"]: x for x in w["by_kind"]}
    assert w["body_scale"] == 0 and "argmax" in kinds and sum(x["tasks"] for x in kinds.values()) > len(kinds)
    assert all(x["as_scheduled_us"] <= w["as_scheduled_us"] + 1e-9 for x in kinds.values())
    assert kinds["argmax"]["as_scheduled_us"] < w["as_scheduled_us"]
    assert [x["as_scheduled_us"] for x in w["by_kind"]] == sorted(x["as_scheduled_us"] for x in w["by_kind"])
    assert "one kind's bodies x0 at a time" in text
    assert main(["analyze", "chain", path, "--scale-bodies", "0.5"]) == 2
    assert "--scale-bodies F (F >= 0) goes with replay" in capsys.readouterr().err


def test_analyze_refuses_another_schedule_and_bad_files(stamps_file, tmp_path, capsys):
    path = stamps_file[0]
    for argv, message in [
            (["analyze", "replay", path, "--programs", "8"], "not the schedule the profile was taken with"),
            (["analyze", "replay", path, "--lanes", "1"], "not the schedule"),
            (["analyze", "replay", str(tmp_path / "none.npz")], "no such file"),
            (["analyze", "replay", MODEL_FILE], "not a task-times file"),
            (["analyze", "replay", path, "--latency-us", "x"], "--latency-us must be comma-separated numbers"),
            (["analyze", "replay", path, "--target", "tpu"], "tpu"),
            (["analyze", "sideways", path], "invalid choice"),
            (["analyze", "replay", path, "--remote-us", "3"], "a mirrored rank's profile")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("kogc: error: ") and message in err[0], (argv, err)


def test_replay_under_another_placement(stamps_file, tmp_path, capsys):
    # the profiled tasks' times carried over to the same tasks placed otherwise: the profiled settings again
    # replay to exactly the profiled placement's time; another placement to its own
    path = stamps_file[0]
    out = tmp_path / "p.json"
    assert main(["analyze", "replay", path, "--place-with", '{"kind_us": {}}', "--json", str(out)]) == 0
    p, = json.loads(out.read_text())["placed_with"]
    assert p["other_us"] == p["profiled_us"] and p["change"] == 0.0 and p["waits"][0] == p["waits"][1]
    assert p["programs_changed"] == 0
    assert "placed with {'kind_us': {}}" in capsys.readouterr().out
    assert main(["analyze", "replay", path, "--place-with", '{"place_latency_us": 3.0}', "--json", str(out)]) == 0
    p, = json.loads(out.read_text())["placed_with"]
    assert p["tile_config"] == {"place_latency_us": 3.0} and p["other_us"] > 0 and p["other_us"] != p["profiled_us"]
    assert 0 < p["programs_changed"] <= 4
    assert p["by_attention_scale"] == []
    capsys.readouterr()
    # --attention-scale: both placements again with attention's bodies longer (a longer context); x1 is the
    # comparison itself, and longer bodies never shorten either replay
    assert main(["analyze", "replay", path, "--place-with", '{"place_latency_us": 3.0}', "--attention-scale",
                 "1,4", "--json", str(out)]) == 0
    q, = json.loads(out.read_text())["placed_with"]
    one, four = q["by_attention_scale"]
    assert (one["profiled_us"], one["other_us"]) == (q["profiled_us"], q["other_us"])
    assert four["attention_scale"] == 4 and four["profiled_us"] > one["profiled_us"]
    assert four["other_us"] > one["other_us"] and four["change"] == four["other_us"] / four["profiled_us"] - 1
    assert "  attention's bodies x4: " in capsys.readouterr().out
    # several placements in one replay: each result as its own replay gives it, in the given order, and a
    # ranking of them by the mean change over the scales
    assert main(["analyze", "replay", path, "--place-with", '[{"place_latency_us": 3.0}, {"kind_us": {}}]',
                 "--attention-scale", "4", "--json", str(out)]) == 0
    a, b = json.loads(out.read_text())["placed_with"]
    assert (a["other_us"], a["by_attention_scale"]) == (q["other_us"], [four])
    assert b["tile_config"] == {"kind_us": {}} and b["change"] == 0.0
    text = capsys.readouterr().out
    ranking = text[text.index("ranked by the mean change"):].splitlines()
    assert len(ranking) == 3 and ranking[0].endswith("x1 | x4), against the profiled placement:")
    order = [line.rsplit("| ", 1)[1] for line in ranking[1:]]
    mean_a = (a["change"] + a["by_attention_scale"][0]["change"]) / 2
    assert order == (['{"place_latency_us": 3.0}', '{"kind_us": {}}'] if mean_a < 0 else
                     ['{"kind_us": {}}', '{"place_latency_us": 3.0}'])
    for argv, message in [
            (["analyze", "replay", path, "--place-with", '{"tile_bytes": 4096}'], "other tasks than the profiled"),
            (["analyze", "chain", path, "--place-with", "{}"], "--place-with goes with replay"),
            (["analyze", "replay", path, "--place-with", "[1]"], "a JSON object of TileConfig fields or a non-empty"),
            (["analyze", "replay", path, "--place-with", "[]"], "a JSON object of TileConfig fields or a non-empty"),
            (["analyze", "replay", path, "--place-with", "[{"], "--place-with is not JSON"),
            (["analyze", "replay", path, "--place-with", '[{}, {"place_latency": 1}]'], "place_latency"),
            (["analyze", "replay", path, "--place-with", '{"place_latency": 1}'], "place_latency"),
            (["analyze", "replay", path, "--place-with", "{"], "tile config is not JSON"),
            (["analyze", "replay", path, "--attention-scale", "2"], "goes with replay --place-with"),
            (["analyze", "replay", path, "--place-with", "{}", "--attention-scale", "0"], "(F > 0)"),
            (["analyze", "replay", path, "--place-with", "{}", "--attention-scale", "x"], "--attention-scale")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (argv, err)


def test_analyze_reads_files_without_a_record(stamps_file, tmp_path, capsys):
    # a file saved with ids and ts only: the schedule comes from the options
    _, s, ids, ts = stamps_file
    bare = tmp_path / "bare.npz"
    np.savez_compressed(bare, ids=ids, ts=ts)
    assert main(["analyze", "chain", str(bare), MODEL_FILE, "--config", "tiny", "--programs", "4"]) == 0
    assert "the chain at 1 us per hop" in capsys.readouterr().out


def test_the_schedule_of_an_ordinary_model_is_built_again(parallel):
    # a model that is not written for kogc is captured with its position tables evaluated (on the CPU, not
    # the meta device): `kogc analyze` rebuilds a profiled Llama's schedule as `kogc compile` builds it
    import os

    from conftest import EXAMPLES
    llama = os.path.join(EXAMPLES, "llama.py")
    s = schedule_for({"model_file": llama, "config": "tiny", "target": "h200", "num_programs": 8,
                      "overrides": {"max_len": 64}})
    assert len(s.queues) == 8 and any(t.kind == "attention" for t in s.tasks)
    assert schedule_for({**META, "num_programs": 8, "overrides": {"num_lanes": 2}}).queues == parallel.queues


# ---------------------------------------------------------------- the stream model (kogc predict)

def _per_kind(schedule, us_of):
    return {kind_key(t): us_of(kind_key(t)) for t in schedule.tasks}


def _free_memory(s, **params):
    """Stream-model parameters with HBM free (no start, no latency, unbounded rates, a 0.7 us hop) and bodies
    made up per kind, and each task's body as the replay as scheduled takes it (attention's growing in part with
    its bytes: attention_fixed_share)."""
    from kogc.analysis.stream import StreamParams
    bodies = _per_kind(s, lambda k: 1.0 + 0.1 * len(k))
    free = StreamParams(body_us=bodies, start_us=0.0, latency_us=0.0, program_gbs=1e12, hbm_gbs=1e12, hop_us=0.7,
                        **params)
    share = free.attention_fixed_share
    dur = [bodies[kind_key(t)] * (share + (1 - share) * t.cost_bytes / 32768 if t.kind == "attention" else 1.0)
           for t in s.tasks]
    return free, dur


@pytest.mark.parametrize("share", [0.0, 0.6, 1.0])
def test_stream_model_grows_attention_with_its_bytes_past_a_fixed_share(parallel, share):
    """An attention body is its kind's times share + (1 - share) x its split's bytes over a 64-position split of
    head_dim 128: with HBM free the step is the replay as scheduled of those bodies; with the whole body fixed it
    does not depend on the context attention is priced at, and otherwise grows with it."""
    from kogc.analysis.ranks import schedules_for
    from kogc.analysis.stream import stream_replay
    s = parallel
    free, dur = _free_memory(s, run_tile_share=1.0, attention_fixed_share=share)
    assert stream_replay(s, free) == pytest.approx(longest_path(s, dur, 0.7, queues=True)[0])
    graph = to_ir(tiny(num_lanes=2))
    cfg = s.tile_config
    short, long = (stream_replay(schedules_for(graph, 1, get_target("h200"), cfg, c)[0], free) for c in (8, 32))
    assert short == pytest.approx(long) if share == 1.0 else short < long


def test_stream_model_with_free_memory_is_the_replay_as_scheduled(parallel):
    """With HBM free (no start, no latency, unbounded rates) the event simulation is the as-scheduled
    longest path of the same bodies and hop, whichever its order of events."""
    from kogc.analysis.stream import stream_replay
    s = parallel
    free, dur = _free_memory(s, run_tile_share=1.0)
    assert stream_replay(s, free) == pytest.approx(longest_path(s, dur, 0.7, queues=True)[0])


def test_stream_model_charges_the_combine_to_the_last_split_of_each_kv_head(monkeypatch):
    """Where the last attention split of a KV head combines the splits (attn_combine_width below the lane's
    width), the model adds combine_us once per (lane, KV head), to the split that ends last: with HBM free, no
    combine is the replay as scheduled, and a combine lengthens the step by at most combine_us a group."""
    from kogc.analysis import stream
    from kogc.analysis.stream import _combining_groups, stream_replay
    from kogc.scheduler import TileConfig
    s = build_schedule(to_ir(tiny(num_lanes=2)), get_target("h200"), "parallel",
                       TileConfig(tile_bytes=512, attn_combine_width=16, attn_splits=4), num_programs=8)
    groups = set(_combining_groups(s.tasks).values())
    assert groups and all(t.kind != "attention" or "last" in t.variant for t in s.tasks)
    free, dur = _free_memory(s, combine_us=0.0, run_tile_share=1.0)
    base = stream_replay(s, free)
    assert base == pytest.approx(longest_path(s, dur, 0.7, queues=True)[0])
    combined = stream_replay(s, dataclasses.replace(free, combine_us=5.0))
    assert base < combined <= base + 5.0 * len(groups)
    # combine_us is for 16 splits' partials; n splits take it times sqrt(n / 16)
    n = s.tile_config.attn_splits
    assert n != 16
    monkeypatch.setattr(stream, "COMBINE_SPLITS", n)
    assert stream_replay(s, dataclasses.replace(free, combine_us=5.0 * (n / 16) ** 0.5)) == pytest.approx(combined)


def test_stream_model_charges_a_matvec_runs_later_tiles_their_share():
    """A matvec run (one loop: one start, one wait, one publish): with HBM free, its tiles after the first cost
    run_tile_share of their body, and the run counts at its last tile's end; with no share for them the step is the
    replay as scheduled with those tiles free, with a whole share the replay of every tile."""
    from kogc.analysis.stream import stream_replay
    from kogc.scheduler import TileConfig
    s = build_schedule(to_ir(tiny(num_lanes=2)), get_target("h200"), "parallel", TileConfig(tile_bytes=512),
                       num_programs=8)
    inside = {q[k] for q, lengths in zip(s.queues, s.run_lengths) for k, n in enumerate(lengths) if n == 0}
    assert len(inside) > 20
    free, dur = _free_memory(s, combine_us=0.0)
    whole = stream_replay(s, dataclasses.replace(free, run_tile_share=1.0))
    assert whole == pytest.approx(longest_path(s, dur, 0.7, queues=True)[0])
    free_tiles = [0.0 if t.id in inside else d for t, d in zip(s.tasks, dur)]
    none = stream_replay(s, dataclasses.replace(free, run_tile_share=0.0))
    assert none == pytest.approx(longest_path(s, free_tiles, 0.7, queues=True)[0]) and none < whole
    assert none < stream_replay(s, free) < whole
    # a start (the table row's reads) is paid once a run, not once a tile
    started = stream_replay(s, dataclasses.replace(free, run_tile_share=1.0, start_us=0.4))
    starts = [0.0 if t.id in inside else 0.4 for t in s.tasks]
    assert started == pytest.approx(longest_path(s, dur, 0.7, queues=True, overhead_us=starts)[0])


def test_stream_model_is_bound_by_the_bytes_when_memory_is_slow(parallel):
    """HBM far slower than the bodies: the step is the bytes at the read bandwidth (within one tile's
    worth), served in order; a per-program cap below the GPU's share only lengthens it."""
    from kogc.analysis.stream import StreamParams, stream_replay
    s = parallel
    total = sum(t.cost_bytes for t in s.tasks)
    slow = StreamParams(body_us=_per_kind(s, lambda k: 0.01), start_us=0.0, latency_us=0.0, hop_us=0.0,
                        hbm_gbs=1e-3, program_gbs=1e9)
    step = stream_replay(s, slow)
    bytes_us = total / (slow.hbm_gbs * 1e3)
    assert bytes_us <= step <= bytes_us * 1.01 + max(t.cost_bytes for t in s.tasks) / (slow.hbm_gbs * 1e3)
    capped = StreamParams(**{**slow.__dict__, "program_gbs": 1e-4})
    assert stream_replay(s, capped) > step


def test_stream_model_of_ranks_pays_the_hop_across_gpus():
    """Two ranks replayed together: a dearer hop across GPUs never shortens the step, and lengthens it
    (layer 0's sums are exchanged at once, on the chain)."""
    from kogc.analysis.ranks import replay_ranks
    from kogc.analysis.stream import StreamParams
    from kogc.scheduler.ranks import build_rank_schedules
    ranks = build_rank_schedules(to_ir(tiny(num_lanes=2)), 2, get_target("h200"), num_programs=8)
    p = StreamParams()
    near, far = replay_ranks(ranks, p, 0.5), replay_ranks(ranks, p, 20.0)
    assert 0 < near < far


def test_speed_model_prices_attention_at_its_context_not_the_placements():
    """kogc predict's schedules keep the queues placed for their cost_context but price attention's reads at the
    context asked for: placed for 96 positions and priced at 32, every attention task costs what the placement
    for 32 gives it and the queues are the placement for 96's; one GPU and two ranks alike."""
    from kogc.analysis.ranks import schedules_for
    from kogc.scheduler import TileConfig
    graph, target = to_ir(tiny(num_lanes=2)), get_target("h200")
    for G in (1, 2):
        placed = schedules_for(graph, G, target, TileConfig(cost_context=96))
        priced = schedules_for(graph, G, target, TileConfig(cost_context=96), context=32)
        short = schedules_for(graph, G, target, TileConfig(cost_context=32))
        for a, b, c in zip(placed, priced, short):
            assert b.queues == a.queues and b.tile_config.cost_context == 96
            attention = [i for i, t in enumerate(b.tasks) if t.kind == "attention"]
            assert attention and all(b.tasks[i].cost_bytes == c.tasks[i].cost_bytes < a.tasks[i].cost_bytes
                                     for i in attention)
            assert all(b.tasks[i].cost_bytes == a.tasks[i].cost_bytes for i in range(len(b.tasks))
                       if i not in set(attention))
        assert schedules_for(graph, G, target, TileConfig(cost_context=96), context=96)[0].queues == placed[0].queues

"""Placement profiles: the task times and placement settings a model ships per target, tile size and weight
format (kogc.settings), and how they reach the placement."""
import dataclasses
import re

import pytest

import laneformer as lf
from kogc.scheduler import TileConfig, build_schedule
from kogc.scheduler.check import check_schedule
from kogc.targets import H200

CFG = TileConfig(tile_bytes=4096)


def test_target_kind_times_apply_to_their_tile_size(graphs):
    # measured per-kind times are the model's, not the target's: the placement uses the config's kind_us
    # (None or {}: the bytes model); kogc.compile fills it from a model's shipped profile when the
    # profile's target and tile size (32 KB for laneformer-2b's) are the compile's
    from kogc.settings import tile_config_for
    from kogc.scheduler.schedule import placement_kind_us
    from kogc.targets import MI300X
    assert not hasattr(H200, "kind_us")
    assert placement_kind_us(TileConfig()) == {} and placement_kind_us(TileConfig(kind_us={})) == {}
    assert placement_kind_us(TileConfig(kind_us={"attention": 3.0})) == {"attention": 3.0}
    model = lf.kogc_model("laneformer-2b", device="meta", seed=None)
    shipped = {(p["target"], p.get("weights", "model")): p for p in lf.placement_profiles("laneformer-2b")}
    assert set(shipped) == {("h200", "model"), ("h200", "fp8"), ("h100", "model")}
    shipped = shipped[("h200", "model")]["kind_us"]
    assert shipped["attention"] == 5.48 and tile_config_for(model, H200).kind_us == shipped
    assert tile_config_for(model, H200, CFG).kind_us is None                      # 4 KB tiles: bytes
    assert tile_config_for(model, H200, TileConfig(kind_us={})).kind_us == {}      # the config's own wins
    assert tile_config_for(model, H200, TileConfig(kind_us={"attention": 3.0})).kind_us == {"attention": 3.0}
    assert tile_config_for(model, MI300X).kind_us is None                          # measured on an H200
    assert tile_config_for(model, H200, interpret=True).kind_us is None            # the interpreter's tiles
    assert not hasattr(lf.kogc_model("laneformer-2b", device="meta", seed=None, num_lanes=4), "kogc_placement")
    g = graphs(2)
    a = build_schedule(g, H200, "parallel", TileConfig(kind_us=shipped), num_programs=8)
    b = build_schedule(g, H200, "parallel", TileConfig(), num_programs=8)
    assert a.est_seconds != b.est_seconds
    check_schedule(a.tasks, a.events, a.queues)


def test_profiles_follow_the_weight_format(graphs):
    # a model's shipped profiles are per weight format: FP8 tasks are placed with FP8's times and the lane
    # groups' offset FP8 measured best with; the config's own values win; unset with no profile: the default
    import torch
    from kogc.settings import placement_profiles, tile_config_for
    from kogc.errors import KogcError
    from kogc.scheduler.config import DEFAULT_LANE_GROUP_STAGGER
    model = lf.kogc_model("laneformer-2b", device="meta", seed=None)
    fp16, fp8 = tile_config_for(model, H200), tile_config_for(model, H200, weights="fp8")
    assert (fp16.lane_homes, fp16.lane_group_stagger, fp16.cost_context) == (4, 8.0, 2048)   # four homes, for 2048
    assert (fp8.lane_homes, fp8.lane_group_stagger, fp8.cost_context) == (0, 6.0, 1024)      # FP8's own
    assert fp8.weights == "fp8" and fp8.kind_us != fp16.kind_us and fp8.kind_us["attention"] == 6.62
    assert tile_config_for(model, H200, TileConfig(weights="fp8")).kind_us == fp8.kind_us   # the config's format
    mine = tile_config_for(model, H200, TileConfig(lane_group_stagger=2.0, kind_us={}), weights="fp8")
    assert (mine.lane_group_stagger, mine.kind_us) == (2.0, {})
    other = lf.kogc_model("laneformer-0.5b", device="meta", seed=None)                  # ships none
    assert tile_config_for(other, H200, weights="fp8").lane_group_stagger == DEFAULT_LANE_GROUP_STAGGER
    # a schedule built without tile_config_for (the offset unset) places with the default offset
    assert TileConfig().lane_group_stagger is None
    unset = build_schedule(graphs(4), H200, "parallel", CFG, num_programs=8)
    default = build_schedule(graphs(4), H200, "parallel",
                             dataclasses.replace(CFG, lane_group_stagger=DEFAULT_LANE_GROUP_STAGGER), num_programs=8)
    assert unset.queues == default.queues
    bad = torch.nn.Linear(2, 2)
    bad.kogc_placement = {"tile_bytes": 4096, "kind_us": {"attention": 1.0}, "weights": "int4"}
    with pytest.raises(KogcError, match="weights"):
        placement_profiles(bad)
    bad.kogc_placement = {"tile_bytes": 4096, "kind_us": {"attention": 1.0}, "lane_group_stagger": -1}
    with pytest.raises(KogcError, match="lane_group_stagger"):
        placement_profiles(bad)


def test_a_profile_carries_every_placement_setting(graphs):
    # a profile may name each placement setting (PLACEMENT_FIELDS) it measured best with: each fills what the
    # config leaves unset (None; lane_homes 0), and the config's own value wins
    import torch
    from kogc.errors import KogcError
    from kogc.scheduler.config import (DEFAULT_COST_CONTEXT, DEFAULT_PLACE_LATENCY_US, PLACEMENT_FIELDS,
                                       with_placement)
    from kogc.settings import placement_profiles, tile_config_for
    assert PLACEMENT_FIELDS == ("lane_group_stagger", "lane_homes", "cost_context", "place_latency_us")
    model = torch.nn.Linear(2, 2)
    placed = {"lane_group_stagger": 8.0, "lane_homes": 4, "cost_context": 2048, "place_latency_us": 2.0}
    model.kogc_placement = {"tile_bytes": 512, "kind_us": {"attention": 1.0}, **placed}
    cfg = tile_config_for(model, H200, TileConfig(tile_bytes=512))
    assert {f: getattr(cfg, f) for f in PLACEMENT_FIELDS} == placed
    mine = tile_config_for(model, H200, TileConfig(tile_bytes=512, lane_homes=1, cost_context=1024,
                                                   place_latency_us=0.5, lane_group_stagger=3.0))
    assert (mine.lane_homes, mine.cost_context, mine.place_latency_us, mine.lane_group_stagger) == (1, 1024, 0.5, 3.0)
    # the settings were measured on one GPU, placing all the lanes: a rank of several GPUs, a share of them,
    # takes the profile's task times and the defaults; a config's own settings reach the ranks unchanged
    assert tile_config_for(model, H200, TileConfig(tile_bytes=512), gpus=2) == with_placement(
        TileConfig(tile_bytes=512, kind_us={"attention": 1.0}))
    assert tile_config_for(model, H200, TileConfig(tile_bytes=512, lane_homes=4, cost_context=2048),
                           gpus=8) == with_placement(TileConfig(tile_bytes=512, kind_us={"attention": 1.0},
                                                                lane_homes=4, cost_context=2048))
    plain = with_placement(TileConfig())
    assert (plain.cost_context, plain.place_latency_us, plain.lane_homes) == (DEFAULT_COST_CONTEXT,
                                                                             DEFAULT_PLACE_LATENCY_US, 0)
    # what each setting does reaches the queues: the profile's schedule is the one its settings give by hand
    by_profile = build_schedule(graphs(4), H200, "parallel", cfg, num_programs=16)
    by_hand = build_schedule(graphs(4), H200, "parallel", TileConfig(tile_bytes=512, kind_us={"attention": 1.0},
                                                                     **placed), num_programs=16)
    default = build_schedule(graphs(4), H200, "parallel", TileConfig(tile_bytes=512, kind_us={"attention": 1.0}),
                             num_programs=16)
    assert by_profile.queues == by_hand.queues != default.queues
    for field, value in [("lane_homes", 0), ("lane_homes", 2.0), ("cost_context", 0), ("cost_context", None),
                         ("place_latency_us", -1), ("place_latency_us", "2")]:
        model.kogc_placement = {"tile_bytes": 512, "kind_us": {"attention": 1.0}, field: value}
        with pytest.raises(KogcError, match=re.escape(f"'{field}': {value!r}")):
            placement_profiles(model)


def test_a_profile_of_the_same_architecture_applies_where_the_target_has_none():
    # laneformer-2b ships its FP8 profile measured on an H200 only; an H100 (the same SM) places with it, since on an
    # H100 it measured better than the bytes model; a profile of this target's own wins over one of its architecture
    # (laneformer-2b's fp16 times, measured on both: the next test)
    import torch
    from kogc.settings import placement_profile, target_named_for, tile_config_for
    from kogc.targets import H100, MI300X
    model = lf.kogc_model("laneformer-2b", device="meta", seed=None)
    assert tile_config_for(model, H100, weights="fp8") == tile_config_for(model, H200, weights="fp8")
    assert tile_config_for(model, MI300X).kind_us is None                     # another architecture
    own, other = {"attention": 1.0}, {"attention": 2.0}
    m = torch.nn.Linear(2, 2)
    m.kogc_placement = [{"tile_bytes": 4096, "kind_us": other, "target": "h200"},
                        {"tile_bytes": 4096, "kind_us": own, "target": "h100"}]
    assert placement_profile(m, H100, 4096)["kind_us"] == own and placement_profile(m, H200, 4096)["kind_us"] == other
    assert placement_profile(m, H100, 8192) is None
    assert [target_named_for(n) for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA GH200")] \
        == ["h100", "h100", "h200", "h200"]


def test_placement_with_measured_kind_times(graphs):
    # TileConfig.kind_us (a profile's microseconds per task kind) and place_latency_us replace the
    # bytes model in the placement: the queues change, the schedule stays sound, and a kind missing
    # from the table falls back to bytes
    from kogc.scheduler.schedule import kind_seconds
    from kogc.scheduler.config import tile_config_from_json
    g = graphs(2)
    base = build_schedule(g, H200, "parallel", CFG, num_programs=8)
    kinds = sorted({t.kind_key for t in base.tasks})
    slow_attention = {k: (40.0 if k == "attention" else 1.0) for k in kinds[1:]}     # kinds[0] left out
    cfg = dataclasses.replace(CFG, kind_us=slow_attention, place_latency_us=1.0)
    s = build_schedule(g, H200, "parallel", cfg, num_programs=8)
    check_schedule(s.tasks, s.events, s.queues)
    assert s.queues != base.queues
    secs = kind_seconds(s.tasks, slow_attention, H200.hbm_read_bw / 8)
    for t, sec in zip(s.tasks, secs):
        assert sec == pytest.approx(slow_attention[t.kind_key] * 1e-6 if t.kind_key in slow_attention
                                    else 0.5e-6 + t.cost_bytes / (H200.hbm_read_bw / 8))
    assert tile_config_from_json('{"kind_us": {"attention": 8.4}, "place_latency_us": 1}').kind_us == {"attention": 8.4}


def test_a_target_takes_its_own_profile_else_one_of_its_architecture():
    # laneformer-2b ships fp16 task times measured on an H100 and on an H200, with the same placement settings:
    # each target takes its own
    from kogc.settings import tile_config_for
    from kogc.targets import get_target
    model = lf.kogc_model("laneformer-2b", device="meta", seed=None)
    h100, h200 = get_target("h100"), H200
    a, b = tile_config_for(model, h100), tile_config_for(model, h200)
    assert a.kind_us != b.kind_us and a.kind_us["attention"] == 4.93 and b.kind_us["attention"] == 5.48
    assert (a.lane_homes, a.lane_group_stagger, a.cost_context, a.place_latency_us) == \
        (b.lane_homes, b.lane_group_stagger, b.cost_context, b.place_latency_us) == (4, 8.0, 2048, 2.0)

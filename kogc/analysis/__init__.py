"""Where a profiled step's time goes, no GPU needed (`kogc analyze`): replays of the schedule with
the measured task times (as scheduled, the chain, perfect balance), what the chain is made of, and a
layer's phases. Input: a task-times file (kogc.analysis.stamps)."""
from __future__ import annotations

import json
import sys

from ..errors import KogcError

from .phases import PHASES, first_layers, format_phases, layer_phases, phases_report, tail_spans, weight_rate
from .replay import (chain_composition, format_chain, format_replay, longest_path, measured_overheads, replay,
                     replay_placement, same_tasks)
from .stamps import body_us, check_fits, load_profiled, load_stamps, save_stamps, schedule_for

ANALYSES = ("replay", "chain", "phases")


def analyze(what: str, path: str, latencies: list[float] | None = None, first_layers_n: int = 0,
            place_with: str | None = None, remote_us: list[float] = (), body_scale: float | None = None,
            attention_scales: list[float] = (), **schedule_args) -> tuple[dict, str]:
    """One analysis of a task-times file: (results, text). schedule_args: see stamps.schedule_for.
    place_with (replay only): TileConfig fields as JSON, over the profiled ones, for another placement of
    the same tasks, replayed with the profile's times beside the profiled one; attention_scales: that
    comparison also with attention's bodies times each. body_scale (replay only): also each task kind's bodies
    scaled by it, one kind at a time."""
    from ..runtime.profile import format_summary, summarize_times
    if what not in ANALYSES:
        raise ValueError(f"unknown analysis {what!r}; known: {', '.join(ANALYSES)}")
    schedule, ids, ts, meta = load_profiled(path, **schedule_args)
    latencies = latencies or [1.0]
    if place_with is not None and what != "replay":
        raise KogcError("--place-with goes with replay")
    if attention_scales and (place_with is None or min(attention_scales) <= 0):
        raise KogcError("--attention-scale F[,F...] (F > 0) goes with replay --place-with")
    if body_scale is not None and (what != "replay" or body_scale < 0):
        raise KogcError("--scale-bodies F (F >= 0) goes with replay")
    if remote_us and (what != "replay" or not meta.get("mirror_of")):
        raise KogcError("--remote-us goes with replay of a mirrored rank's profile (kogc bench --gpus G --mirror "
                        "--profile --task-times FILE)")
    if what == "replay":
        summary = summarize_times(schedule, ids, ts)
        res = {"summary": summary, **replay(schedule, ids, ts, latencies, remote_us, body_scale)}
        if place_with is not None:
            res["placed_with"] = _placed_with(schedule, ids, ts, meta, place_with, schedule_args, attention_scales)
        return res, format_summary(summary) + "\n" + format_replay(res)
    if what == "chain":
        res = chain_composition(schedule, body_us(schedule, ids, ts), latencies[0])
        return res, format_chain(res, latencies[0])
    res = phases_report(schedule, ids, ts, first_layers_n, meta.get("read_bw_Bps"), meta.get("device"))
    return res, format_phases(res)


def _placed_with(schedule, ids, ts, meta: dict, place_with: str, schedule_args: dict,
                 attention_scales: list[float] = ()) -> list[dict]:
    """replay_placement against the schedule of the profiled settings with each of place_with's field sets
    over them (place_with: one JSON object of TileConfig fields, or a list of them)."""
    from ..scheduler.config import tile_config_from_fields, tile_config_from_json
    if place_with.lstrip().startswith("["):
        try:
            fields_list = json.loads(place_with)
        except json.JSONDecodeError as e:
            raise KogcError(f"--place-with is not JSON ({e.msg} at character {e.pos}): {place_with!r}") from None
        if not fields_list or not all(isinstance(f, dict) for f in fields_list):
            raise KogcError(f"--place-with takes a JSON object of TileConfig fields or a non-empty list of them, "
                            f"got {place_with!r}")
        for f in fields_list:
            tile_config_from_fields(f)      # one clear error for unknown fields or values
    else:
        tile_config_from_json(place_with)   # one clear error for bad JSON, unknown fields or values
        fields_list = [json.loads(place_with)]
    base = json.loads(schedule_args.get("tile_config") or "null") or meta.get("tile_config") or {}

    def others():
        for i, fields in enumerate(fields_list):
            if len(fields_list) > 1:
                print(f"kogc analyze: placement {i + 1} of {len(fields_list)}: {json.dumps(fields)}",
                      file=sys.stderr, flush=True)
            other = schedule_for(meta, **{**schedule_args, "tile_config": json.dumps({**base, **fields})})
            if not same_tasks(schedule, other):
                raise KogcError(f"--place-with {json.dumps(fields)}: other tasks than the profiled schedule's (tile "
                                f"sizes, splits or kinds changed); a replay carries measured times over to another "
                                f"placement only")
            yield other
    return [{"tile_config": f, **r}
            for f, r in zip(fields_list, replay_placement(schedule, others(), ids, ts, attention_scales))]

__all__ = ["ANALYSES", "PHASES", "analyze", "body_us", "chain_composition", "check_fits", "first_layers",
           "format_chain", "format_phases", "format_replay", "layer_phases", "load_stamps", "longest_path",
           "measured_overheads", "phases_report", "replay", "replay_placement", "same_tasks", "save_stamps", "schedule_for", "tail_spans",
           "weight_rate"]

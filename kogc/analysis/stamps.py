"""A profiled step's per-task stamps on disk, and the schedule they belong to.

A file (.npz) holds `ids` (task ids in queue order), `ts` ([tasks, 3 or more] ns from the step's first
start: start, after the waits, end; a "detail" profile adds more, see kogc.runtime.profile) and `meta`:
a JSON string naming the model (model file, preset or checkpoint, overrides), the target, the number
of programs and every TileConfig field the schedule was built with (and, for a mirrored rank of
`kogc bench --gpus G --mirror`, G; the GPU and the run's read bandwidth where known), so that
`kogc analyze` can build the same schedule again, also after a default changed. (Older files recorded
only the fields that differed from their commit's defaults.) `kind` (one index a task, in the order of `ids`,
into the meta's `kinds`) names each task's kind, so that the bodies by kind (`kogc predict --bodies`) read
without the schedule, also once the kernel has changed; files written before it have none.
`kogc bench --profile --task-times FILE` (also with `--gpus G --mirror`) and `kogc sweep` (a variant
with "profile": true, and --out DIR) write them.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from ..errors import KogcError


def save_stamps(ck, path: str, model_file: str | None = None, preset: str | None = None,
                checkpoint: str | None = None, overrides: dict | None = None, read_bw_Bps: float | None = None) -> str:
    """Write the last launch's stamps of a profiled kernel `ck` to `path` (.npz); returns the path. The meta
    also names the GPU the target was fitted to and, where the caller measured it, the run's read bandwidth
    (bytes/s), which `kogc analyze phases` holds the phases' bytes against instead of the target's figure."""
    from ..runtime.profile import timestamps
    ids, ts = timestamps(ck)
    s = ck.schedule
    meta = {"model_file": model_file, "config": preset, "checkpoint": checkpoint, "overrides": overrides or {},
            "target": s.target.name, "num_programs": len(s.queues), "tile_config": dataclasses.asdict(s.tile_config),
            "tasks": len(s.tasks), "device": s.target.device or None}
    if read_bw_Bps:
        meta["read_bw_Bps"] = float(read_bw_Bps)
    if getattr(ck, "stamps_schedule", s) is not s:      # rank 0 of G with its peers mirrored
        meta["mirror_of"] = s.ranks
    names = sorted({t.kind_key for t in s.tasks})
    meta["kinds"] = names
    index = {k: i for i, k in enumerate(names)}
    kind = np.array([index[s.tasks[int(t)].kind_key] for t in ids], dtype=np.int16)
    if not path.endswith(".npz"):
        path += ".npz"
    _write(path, ids, ts, meta, kind)
    return path


def record_read_bandwidth(path: str, read_bw_Bps: float) -> None:
    """Set the read bandwidth a stamps file names (bytes/s). `kogc bench` writes the file before its second
    reading and takes the higher of the two for its floor; this makes the file's the floor's."""
    ids, ts, meta = load_stamps(path)
    meta["read_bw_Bps"] = float(read_bw_Bps)
    data = np.load(path, allow_pickle=False)
    _write(path, ids, ts, meta, np.asarray(data["kind"]) if "kind" in data.files else None)


def _write(path: str, ids: np.ndarray, ts: np.ndarray, meta: dict, kind: np.ndarray | None = None) -> None:
    extra = {} if kind is None else {"kind": kind}
    np.savez_compressed(path, ids=ids, ts=ts, meta=np.array(json.dumps(meta)), **extra)


def load_stamps(path: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """(ids, ts, meta) of a stamps file; meta is {} for a file written without it."""
    if not os.path.isfile(path):
        raise KogcError(f"{path}: no such file")
    try:
        data = np.load(path, allow_pickle=False)
        ids, ts = np.asarray(data["ids"]), np.asarray(data["ts"])
        meta = json.loads(str(data["meta"])) if "meta" in data.files else {}
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        raise KogcError(f"{path}: not a task-times file (.npz with ids and ts): {e}") from None
    if ids.ndim != 1 or ts.ndim != 2 or ts.shape[0] != len(ids) or ts.shape[1] < 3:
        raise KogcError(f"{path}: ids {ids.shape} and ts {ts.shape} do not fit (one row of at least 3 stamps "
                        f"per task)")
    return ids, ts, meta


def load_kinds(path: str) -> list[str] | None:
    """Each task's kind, in the order of the file's ids; None for a file written without them."""
    ids, _, meta = load_stamps(path)
    return _kinds(path, ids, meta)


def _kinds(path: str, ids: np.ndarray, meta: dict) -> list[str] | None:
    data = np.load(path, allow_pickle=False)
    if "kind" not in data.files or "kinds" not in meta:
        return None
    kind, names = np.asarray(data["kind"]), meta["kinds"]
    if kind.shape != ids.shape or (kind.size and not 0 <= int(kind.min()) <= int(kind.max()) < len(names)):
        raise KogcError(f"{path}: its task kinds ({kind.shape}) do not fit its {len(ids)} tasks and {len(names)} "
                        f"kind names")
    return [names[int(k)] for k in kind]


def bodies_of_file(path: str) -> dict[str, list[float]]:
    """Per kind, every task's body (after its waits to its end, us) in a stamps file: by the kinds it
    records, else by the schedule it was taken with, built again (which must still fit)."""
    ids, ts, meta = load_stamps(path)
    kinds = _kinds(path, ids, meta)
    if kinds is None:
        from .stream import bodies_by_kind
        schedule = schedule_for(meta)
        check_fits(schedule, ids, path)
        return bodies_by_kind(schedule, ids, ts)
    per: dict[str, list[float]] = {}
    for k, row in zip(kinds, ts):
        per.setdefault(k, []).append(float(row[2] - row[1]) / 1e3)
    return per


def schedule_for(meta: dict, model_file: str | None = None, preset: str | None = None,
                 checkpoint: str | None = None, lanes: int | None = None, tile_config: str | None = None,
                 target: str | None = None, num_programs: int | None = None):
    """The schedule a stamps file was taken with: what the arguments give, else what its meta says,
    else the defaults (the example model, laneformer-2b, h200, the target's programs, TileConfig());
    its settings: recorded_config."""
    from ..frontend import to_ir
    from ..frontend.model_file import build_for_tracing
    from ..scheduler import build_schedule
    from ..targets import get_target

    if checkpoint is None and preset is None:
        checkpoint = meta.get("checkpoint")
    preset = preset or (None if checkpoint else meta.get("config") or "laneformer-2b")
    model_file = model_file or meta.get("model_file") or os.path.join("examples", "laneformer.py")
    overrides = dict(meta.get("overrides") or {})
    if lanes:
        overrides["num_lanes"] = lanes
    try:
        tgt = get_target(target or meta.get("target") or "h200")
    except KeyError as e:
        raise KogcError(e.args[0]) from None
    model = build_for_tracing(model_file, preset=preset, checkpoint=checkpoint, **overrides)
    cfg = recorded_config(meta, model, tgt, tile_config)
    programs = num_programs or meta.get("num_programs")
    if meta.get("mirror_of"):    # rank 0 of G, its peers mirrored: read as one GPU's schedule
        from ..scheduler.ranks import build_rank_schedules, mirrored
        G = meta["mirror_of"]           # (an ordinary decoder is cut into G lanes first, as kogc.compile cuts it)
        return mirrored(build_rank_schedules(to_ir(model, gpus=G), G, tgt, "parallel", cfg, num_programs=programs)[0])
    return build_schedule(to_ir(model), tgt, "parallel", cfg, num_programs=programs)


def recorded_config(meta: dict, model, target, tile_config: str | None = None):
    """The TileConfig a stamps file's kernel was compiled with. The meta's is read as it stands (what it leaves
    unset, the defaults): its compile had filled in the model's profile of that day, which may since have
    changed (laneformer-2b's gained four lane homes). A config given here (JSON), or none recorded, is placed as
    kogc.compile places it (kogc.settings.tile_config_for)."""
    from ..scheduler import TileConfig
    from ..scheduler.config import tile_config_from_json, with_placement
    from ..settings import tile_config_for
    if not tile_config and meta.get("tile_config"):
        return with_placement(tile_config_from_json(json.dumps(meta["tile_config"])))
    cfg = tile_config_from_json(tile_config) if tile_config else TileConfig()
    return tile_config_for(model, target, cfg, gpus=meta.get("mirror_of") or 1)


def check_fits(schedule, ids: np.ndarray, path: str) -> None:
    """Refuse stamps of another schedule: the same tasks in the same queues, in the same order."""
    n = len(schedule.tasks)
    order = [t for q in schedule.queues for t in q]
    if len(ids) != n or sorted(int(i) for i in ids) != list(range(n)) or [int(i) for i in ids] != order:
        raise KogcError(f"{path} has {len(ids)} tasks, this schedule {n} on {len(schedule.queues)} programs "
                        f"(or another order): not the schedule the profile was taken with; give the model, "
                        f"--config, --lanes, --tile-config and --programs it was compiled with")


def load_profiled(path: str, **schedule_args):
    """(schedule, ids, ts, meta) of a stamps file: the schedule it was taken with built again
    (schedule_args: see schedule_for) and checked to fit the stamps."""
    ids, ts, meta = load_stamps(path)
    schedule = schedule_for(meta, **schedule_args)
    check_fits(schedule, ids, path)
    return schedule, ids, ts, meta


def body_us(schedule, ids: np.ndarray, ts: np.ndarray) -> list[float]:
    """Each task's body (after its waits to its end, us), by task id."""
    body = [0.0] * len(schedule.tasks)
    for tid, row in zip(ids, ts):
        body[int(tid)] = float(row[2] - row[1]) / 1e3
    return body

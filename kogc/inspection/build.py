"""What `kogc inspect` looks at: a schedule and what a build folder holds beside it.

A build folder (`kogc compile ... --out DIR`) holds `schedule.json` (tasks, events, queues, variants),
`report.txt`, `ir.txt` (the IR with the model source line of every node), `kernel.py`, the compiled
artifacts (`sm_90/` or `gfx942/`: Triton's `.json` metadata beside the binaries) and, after
`--per-variant`, `variants.txt`. The schedule is rebuilt from schedule.json as plain `Task` and `Event`
objects: everything kogc's own analyses read (`waits`, `group`, `cost_bytes`, the variant, the queues)
is there; the exact producers (`Task.deps`), the fused ops and the settings (`TileConfig`) are not.
A profile without a build folder gets its schedule from `kogc.analysis.stamps.schedule_for` (a full
`Schedule`, rebuilt from the model named in the profile's record).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from ..errors import KogcError
from ..scheduler.deps import Event
from ..scheduler.tasks import Task, WeightTile
from ..scheduler.config import ESIZE
from ..targets import Target, get_target

ARCH_DIRS = ("sm_90", "gfx942")


@dataclass
class BuildSchedule:
    """A schedule as schedule.json records it: the attributes of `kogc.scheduler.Schedule` that the
    analyses use (tasks, events, queues, variants, target, placement)."""
    target: Target
    placement: str
    variants: list[tuple]
    tasks: list[Task]
    events: list[Event]
    queues: list[list[int]]

    @property
    def num_programs(self) -> int:
        return len(self.queues)


@dataclass
class IrNode:
    """One line of ir.txt: the node's text, its module scope and the model source line."""
    name: str
    text: str
    scope: str
    source: str
    dtype: str


@dataclass
class Inspected:
    """A schedule with what is known around it."""
    schedule: object                     # BuildSchedule or kogc.scheduler.Schedule
    where: str                           # the build folder or the profile (for messages)
    esize: int                           # bytes per weight element
    nodes: dict[str, IrNode] = field(default_factory=dict)
    report: str | None = None            # report.txt
    variant_rows: list[dict] | None = None   # variants.txt, parsed
    machine: dict | None = None          # the whole kernel's disassembly summary
    metadata: dict | None = None         # Triton's metadata of the compiled kernel
    kind_us: dict = field(default_factory=dict)   # the placement's cost model (us per kind; {}: bytes)
    kind_us_known: bool = True           # False: a build folder, whose settings are not recorded
    latency_us: float = 1.0              # the placement's hop latency
    est_us: float | None = None          # the placement's estimate of the step
    est_resolution_us: float = 0.0       # 1: read from report.txt (printed in ms to 3 decimals)
    cache: dict = field(default_factory=dict, repr=False)   # what costs.py computes once (run order, ...)

    @property
    def is_build(self) -> bool:
        return isinstance(self.schedule, BuildSchedule)

    def layers(self) -> list[int]:
        return sorted({t.layer for t in self.schedule.tasks if t.layer is not None})


_NODE = re.compile(r"^\s+(%\S+)\s+=\s+(.*?)\s+:\s+(\S+)(?:\s{3}# (.*))?$")
_DTYPE = re.compile(r"(?:L\d+:)?(\w+)\[")


def parse_ir(text: str) -> dict[str, IrNode]:
    """ir.txt (kogc.ir.to_text with sources) -> {node name: IrNode}."""
    nodes, scope = {}, "<top>"
    for line in text.splitlines():
        if line.startswith("  # "):
            scope = line[4:].strip()
            continue
        m = _NODE.match(line)
        if m:
            name, body, typ, source = m.groups()
            d = _DTYPE.match(typ)
            nodes[name] = IrNode(name, f"{name} = {body} : {typ}", scope, source or "", d.group(1) if d else "")
    return nodes


def weight_esize(nodes: dict[str, IrNode], schedule) -> int:
    """Bytes per weight element: the dtype of the matvec weights in the IR (the model's dtype)."""
    for t in schedule.tasks:
        if t.weight is not None:
            n = next((n for n in nodes.values() if f"param(name={t.weight.param})" in n.text), None)
            if n is not None and n.dtype in ESIZE:
                return ESIZE[n.dtype]
    return ESIZE.get(getattr(getattr(schedule, "graph", None), "weight_dtype", ""), 2)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def schedule_from_json(text: str, where: str) -> BuildSchedule:
    """schedule.json (Schedule.to_json) -> a BuildSchedule; a KogcError naming the file if it is not one."""
    try:
        d = json.loads(text)
        target = get_target(d["target"])
        variants = [tuple(v) for v in d["variants"]]
        tasks = []
        for j, r in enumerate(d["tasks"]):
            if r["id"] != j:
                raise ValueError(f"task {j} has id {r['id']}")
            w = r["weight"]
            tasks.append(Task(id=j, variant=variants[r["variant"]], op=r["op"], lane=r["lane"], layer=r["layer"],
                              args=list(r["args"]), reads=[], writes=[],
                              weight=None if w is None else WeightTile(*w), cost_bytes=r["cost_bytes"],
                              group=r["publish"], waits=[(int(g), int(n)) for g, n in r["waits"]],
                              publish_too=int(r.get("publish_too", -1))))
        producers: dict[int, list[int]] = {}
        for t in tasks:         # an op's event over all lanes counts its producers too (shared lane events)
            for g in t.published:
                producers.setdefault(g, []).append(t.id)
        events = []
        for j, e in enumerate(d["events"]):
            remote = int(e.get("remote", 0))      # producers on other ranks
            if e["id"] != j or len(producers.get(j, [])) + remote != e["need"]:
                raise ValueError(f"event {j} ({e['name']}) needs {e['need']} tasks, {len(producers.get(j, []))} "
                                 f"publish to it" + (f" and {remote} peers" if remote else ""))
            events.append(Event(j, e["name"], producers.get(j, []), remote))
        queues = [list(map(int, q)) for q in d["queues"]]
        placed = sorted(t for q in queues for t in q)
        if placed != list(range(len(tasks))):
            raise ValueError("the queues do not hold every task once")
        _stand_in_for_peers(d, tasks, events)
        return BuildSchedule(target, d["placement"], variants, tasks, events, queues)
    except KeyError as e:
        if e.args and isinstance(e.args[0], str) and e.args[0].startswith("unknown target"):
            raise KogcError(f"{where}: {e.args[0]}") from None
        raise KogcError(f"{where}: not a kogc schedule.json (no {e.args[0]!r})") from None
    except (ValueError, TypeError, IndexError, AttributeError) as e:
        raise KogcError(f"{where}: not a kogc schedule.json: {e}") from None


def _stand_in_for_peers(d: dict, tasks: list[Task], events: list[Event]) -> None:
    """One rank of several (kogc.scheduler.ranks) read alone: a wait on the sum its peers send becomes a
    wait on this rank's own send of the same sum (every rank runs the same tasks, so the peers' sums are
    taken to arrive when this rank's is sent), so that the analyses can replay the rank by itself."""
    for x in d.get("exchanges", []):
        sends = x["sends"] if "sends" in x else [x["send"]]     # (a build written before sums went in blocks)
        sender = tasks[sends[0]].group
        for t in tasks:
            t.waits = [(sender, events[sender].need) if g == x["event"] else (g, n) for g, n in t.waits]


_KV = re.compile(r"(\w+) (\{[^}]*\}|[^,]+)")


def parse_machine_line(report: str | None) -> dict | None:
    """report.txt's `machine code: k v, ...` line -> {k: int | str | dict} (None without one)."""
    line = next((ln for ln in (report or "").splitlines() if ln.startswith("machine code: ")), None)
    if line is None:
        return None
    out: dict = {}
    for k, v in _KV.findall(line[len("machine code: "):]):
        v = v.strip()
        if v.startswith("{"):
            out[k] = {int(a): int(b) for a, b in re.findall(r"(\d+): (\d+)", v)}
        else:
            out[k] = int(v) if re.fullmatch(r"-?\d+", v) else v
    return out


def parse_variants(text: str | None) -> list[dict] | None:
    """variants.txt (kogc.codegen.variants.format_variant_table) -> rows {id, registers, spill_store_bytes,
    bar_sync, st_global, loads, variant}."""
    if not text:
        return None
    rows = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 6 or not parts[0].isdigit():
            continue
        def num(x):
            return int(x) if x.lstrip("-").isdigit() else None
        rows.append({"id": int(parts[0]), "registers": num(parts[1]), "spill_store_bytes": num(parts[2]),
                     "bar_sync": num(parts[3]), "st_global": num(parts[4]), "loads": " ".join(parts[5:-1]),
                     "variant": parts[-1]})
    return rows


def _artifacts(build: str) -> tuple[dict, dict | None]:
    """{kind: path} of the compiled kernel in an arch folder of the build, and Triton's metadata."""
    for arch in ARCH_DIRS:
        d = os.path.join(build, arch)
        if os.path.isdir(d):
            arts = {}
            for name in sorted(os.listdir(d)):
                stem, ext = os.path.splitext(name)
                if ext == ".json":
                    arts["metadata"] = os.path.join(d, name)
                elif ext:
                    arts[ext[1:]] = os.path.join(d, name)
            meta = None
            if "metadata" in arts:
                try:
                    with open(arts["metadata"]) as f:
                        meta = json.load(f)
                except (OSError, ValueError):
                    meta = None
            return arts, meta
    return {}, None


def load_kind_us(text: str) -> dict:
    """--kind-us: a JSON object {kind: us}, or a file holding one (or a profile with a "kind_us" key,
    e.g. examples/profiles/laneformer-2b.h200.json)."""
    src = text
    if os.path.isfile(text):
        src = _read(text) or ""
    try:
        d = json.loads(src)
    except ValueError:
        raise KogcError(f"--kind-us: neither a file nor JSON: {text!r}") from None
    if isinstance(d, dict) and isinstance(d.get("kind_us"), dict):
        d = d["kind_us"]
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, (int, float)) and v > 0
                                          for k, v in d.items()):
        raise KogcError(f"--kind-us: must map task kinds (e.g. \"matvec/rmsnorm/store\") to microseconds > 0, "
                        f"got {text!r}")
    return {k: float(v) for k, v in d.items()}


def load_build(path: str, kind_us: dict | None = None, machine_code: bool = True) -> Inspected:
    """A build folder -> Inspected; a KogcError naming the folder if it is not one."""
    if not os.path.exists(path):
        raise KogcError(f"{path}: no such build folder")
    if not os.path.isdir(path):
        raise KogcError(f"{path}: not a build folder (a folder written by kogc compile ... --out DIR)")
    sj = os.path.join(path, "schedule.json")
    text = _read(sj)
    if text is None:
        ranks = sorted(d for d in os.listdir(path) if d.startswith("rank") and d[4:].isdigit())
        if ranks:       # kogc compile --gpus G --out DIR writes one build a rank
            raise KogcError(f"{path}: a build of {len(ranks)} ranks: inspect one of them, e.g. "
                            f"{os.path.join(path, ranks[0])}")
        raise KogcError(f"{path}: not a kogc build folder (no schedule.json; kogc compile ... --out DIR writes one)")
    schedule = schedule_from_json(text, sj)
    nodes = parse_ir(_read(os.path.join(path, "ir.txt")) or "")
    report = _read(os.path.join(path, "report.txt"))
    est = None
    m = re.search(r"cost model: ([\d.]+) ms per step", report or "")
    if m:
        est = float(m.group(1)) * 1e3
    arts, meta = _artifacts(path)
    machine = parse_machine_line(report)
    if machine is None and machine_code and any(k in arts for k in ("ptx", "cubin", "amdgcn", "hsaco")):
        from ..codegen.aot import disassembly_summary
        machine = disassembly_summary(arts) or None
    from ..scheduler.config import DEFAULT_PLACE_LATENCY_US
    recorded = json.loads(text).get("tile_config") or {}       # (builds before it was recorded: none)
    if kind_us is None and isinstance(recorded.get("kind_us"), dict):
        kind_us = recorded["kind_us"]                            # the task times the placement used
    latency = recorded.get("place_latency_us")
    latency = DEFAULT_PLACE_LATENCY_US if latency is None else latency       # (recorded before it could be unset)
    return Inspected(schedule, path, weight_esize(nodes, schedule), nodes, report,
                     parse_variants(_read(os.path.join(path, "variants.txt"))), machine, meta,
                     kind_us=dict(kind_us or {}), kind_us_known=kind_us is not None or bool(recorded),
                     latency_us=latency, est_us=est, est_resolution_us=1.0)


def from_schedule(schedule, where: str, kind_us: dict | None = None) -> Inspected:
    """A full kogc.scheduler.Schedule (e.g. rebuilt for a profile) -> Inspected."""
    from ..ir import to_text
    from ..scheduler.schedule import placement_kind_us
    nodes = parse_ir(to_text(schedule.graph, sources=True))
    cfg = schedule.tile_config
    return Inspected(schedule, where, ESIZE[schedule.dtype], nodes, report=schedule.report(),
                     kind_us=dict(kind_us if kind_us is not None else placement_kind_us(cfg)),
                     latency_us=cfg.place_latency_us,
                     est_us=schedule.est_seconds * 1e6 if schedule.placement == "parallel" else None)

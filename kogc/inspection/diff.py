"""`kogc inspect --diff A B`: two builds, or two profiles, side by side with the difference B - A."""
from __future__ import annotations

import os
from collections import Counter

import numpy as np

from ..errors import KogcError
from ..runtime.profile import kind_key
from . import costs


def kind_of_input(path: str) -> str:
    """"build" (a folder with schedule.json) or "profile" (a .npz file); a KogcError otherwise."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "schedule.json")):
            raise KogcError(f"--diff {path}: not a kogc build folder (no schedule.json)")
        return "build"
    if os.path.isfile(path):
        if not path.endswith(".npz"):
            raise KogcError(f"--diff {path}: neither a build folder nor a task-times file (.npz)")
        return "profile"
    raise KogcError(f"--diff {path}: no such file or folder")


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{x:.6g}"


class Table:
    """Rows of (name, a, b) with the difference; counts the rows that differ."""

    def __init__(self, a: str, b: str, width: int = 44):
        self.lines = [f"{'':{width}} {'A':>12} {'B':>12} {'B - A':>12}"]
        self.width = width
        self.differ = 0
        self.a, self.b = a, b

    def section(self, title: str) -> None:
        self.lines.append(title)

    def row(self, name: str, a, b, tol: float = 0.0) -> None:
        if a is None or b is None:
            d = None
            changed = (a is None) != (b is None)
        else:
            d = b - a
            changed = abs(d) > tol
        self.differ += bool(changed)
        mark = " *" if changed else ""
        shown = _fmt(d) if changed or d is None else "0"
        self.lines.append(f"{name:{self.width}} {_fmt(a):>12} {_fmt(b):>12} {shown:>12}{mark}")

    def text(self) -> str:
        tail = ("differences: none" if self.differ == 0
                else f"differences: {self.differ} row{'s' * (self.differ > 1)} (marked *)")
        return "\n".join([f"A: {self.a}", f"B: {self.b}"] + self.lines + [tail])


def _machine(ins) -> dict:
    return ins.machine or {}


def diff_builds(a, b) -> str:
    """Two Inspected builds: tasks per kind, per program tasks and bytes, the cost model's step and
    chain, code variants, events, registers and spills."""
    ta = Table(a.where, b.where)
    sa, sb = a.schedule, b.schedule
    ta.section("schedule")
    ta.row("  programs", len(sa.queues), len(sb.queues))
    ta.row("  tasks", len(sa.tasks), len(sb.tasks))
    ta.row("  code variants", len(sa.variants), len(sb.variants))
    ta.row("  events", len(sa.events), len(sb.events))
    ta.row("  waits", sum(len(t.waits) for t in sa.tasks), sum(len(t.waits) for t in sb.tasks))
    ta.section("tasks per kind")
    ka, kb = Counter(kind_key(t) for t in sa.tasks), Counter(kind_key(t) for t in sb.tasks)
    for k in sorted(set(ka) | set(kb)):
        ta.row(f"  {k}", ka.get(k, 0), kb.get(k, 0))
    ua, ub = costs.task_us(a), costs.task_us(b)
    pa, pb = costs.per_program(a, ua), costs.per_program(b, ub)
    ta.section("per program (min / mean / max)")
    for key, name, scale in (("tasks", "tasks", 1), ("weight_bytes", "weight MB", 1e6),
                             ("bytes", "bytes MB (cost model)", 1e6),
                             ("busy_us", "predicted busy us", 1)):
        for stat in ("min", "mean", "max"):
            x, y = getattr(np, stat)(pa[key]) / scale, getattr(np, stat)(pb[key]) / scale
            ta.row(f"  {name} {stat}", float(x), float(y), tol=1e-9)
    ta.row("  weight MB total", pa["weight_bytes"].sum() / 1e6, pb["weight_bytes"].sum() / 1e6, tol=1e-9)
    ta.section("cost model (us)")
    ta.row("  step as scheduled", costs.as_scheduled(a, ua)[0], costs.as_scheduled(b, ub)[0], tol=1e-6)
    ta.row("  the chain through the waits", costs.chain(a, ua)["us"], costs.chain(b, ub)["us"], tol=1e-6)
    ta.row("  the placement's estimate (report)", a.est_us, b.est_us, tol=1e-6)
    ma, mb = _machine(a), _machine(b)
    if ma or mb:
        ta.section("machine code (the whole kernel)")
        for k in ("registers", "spill_store_bytes", "spill_load_bytes", "local_bytes", "ld_global", "ld_global_128",
                  "vgprs", "scratch_bytes"):
            if k in ma or k in mb:
                ta.row(f"  {k}", ma.get(k), mb.get(k))
    if a.variant_rows or b.variant_rows:
        ta.section("code variants alone (variants.txt): max registers / total spill bytes")
        for name, key, f in (("registers max", "registers", max), ("spill bytes", "spill_store_bytes", sum)):
            va = [r[key] for r in a.variant_rows or [] if r[key] is not None]
            vb = [r[key] for r in b.variant_rows or [] if r[key] is not None]
            ta.row(f"  {name}", f(va) if va else None, f(vb) if vb else None)
    return ta.text()


def diff_profiles(a, pa, b, pb) -> str:
    """Two profiles: the step span, and per kind the waiting and the bodies (totals over the programs
    and means per task), us."""
    from .profiled import profile_kind_totals
    sa, sb = profile_kind_totals(a, pa), profile_kind_totals(b, pb)
    t = Table(pa.path, pb.path)
    t.section("step (us)")
    t.row("  span", sa["span_us"], sb["span_us"], tol=1e-9)
    t.row("  tasks", sa["tasks"], sb["tasks"])
    t.row("  programs", len(a.schedule.queues), len(b.schedule.queues))
    t.row("  busy share (mean over programs)", sa["busy_share_mean"], sb["busy_share_mean"], tol=1e-9)
    t.row("  waiting share", sa["wait_share_mean"], sb["wait_share_mean"], tol=1e-9)
    t.row("  blocked us per program", sa["blocked_us_per_program"], sb["blocked_us_per_program"], tol=1e-9)
    t.row("  notify us per program", sa["notify_us_per_program"], sb["notify_us_per_program"], tol=1e-9)
    kinds = sorted(set(sa["per_kind"]) | set(sb["per_kind"]))
    zero = {"tasks": 0, "wait_us_total": 0.0, "body_us_total": 0.0, "wait_us_mean": None, "body_us_mean": None}
    t.section("per kind (us): tasks, wait total, body total, body mean")
    for k in kinds:
        x, y = sa["per_kind"].get(k, zero), sb["per_kind"].get(k, zero)
        t.row(f"  {k} tasks", x["tasks"], y["tasks"])
        t.row(f"  {k} wait", x["wait_us_total"], y["wait_us_total"], tol=1e-9)
        t.row(f"  {k} body", x["body_us_total"], y["body_us_total"], tol=1e-9)
        t.row(f"  {k} body mean", x["body_us_mean"], y["body_us_mean"], tol=1e-9)
    t.section("all kinds (us)")
    t.row("  wait total", sum(v["wait_us_total"] for v in sa["per_kind"].values()),
          sum(v["wait_us_total"] for v in sb["per_kind"].values()), tol=1e-9)
    t.row("  body total", sum(v["body_us_total"] for v in sa["per_kind"].values()),
          sum(v["body_us_total"] for v in sb["per_kind"].values()), tol=1e-9)
    return t.text()

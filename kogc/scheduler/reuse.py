"""Schedules built once within a scope. A profiled kernel beside the timed one (`kogc bench --profile`, the
profiled step of `kogc bench --gpus G`) runs the same schedule as the kernel it profiles: inside
`schedules_reused()` a schedule asked for again, of the same IR, target and settings, is the one built
before (laneformer-7b's takes 25 s on 2 cores, its 8 ranks' 40 s). Outside a scope nothing is kept, and
inside one the schedules live until it ends. A schedule got in a scope is shared: change a copy, not it
(kogc.analysis.ranks.schedules_for, which reprices attention in place, runs outside any)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable

from ..ir.printer import to_json

_built: dict | None = None     # key -> the schedule (or a rank's list of them), while a scope is open


@contextlib.contextmanager
def schedules_reused():
    """Within: build_schedule and build_rank_schedules return what they built before for the same
    arguments (the IR compared by its full text). Nested scopes share the outermost's."""
    global _built
    outer = _built
    _built = {} if outer is None else outer
    try:
        yield
    finally:
        _built = outer


def reused(kind: str, graph, settings: tuple, build: Callable):
    """build(), or within a scope what it returned for the same kind, IR and settings (reprs of plain
    data: the target, the TileConfig, placement, programs, checks)."""
    if _built is None:
        return build()
    key = (kind, to_json(graph), repr(settings))
    if key not in _built:
        _built[key] = build()
    return _built[key]

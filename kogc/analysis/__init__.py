"""Where a profiled step's time goes, no GPU needed (`kogc analyze`): replays of the schedule with
the measured task times (as scheduled, the chain, perfect balance), what the chain is made of, and a
layer's phases. Input: a task-times file (kogc.analysis.stamps)."""
from __future__ import annotations

from .phases import PHASES, first_layers, format_phases, layer_phases, phases_report, tail_spans, weight_rate
from .replay import chain_composition, format_chain, format_replay, longest_path, measured_overheads, replay
from .stamps import body_us, check_fits, load_stamps, save_stamps, schedule_for

ANALYSES = ("replay", "chain", "phases")


def analyze(what: str, path: str, latencies: list[float] | None = None, first_layers_n: int = 0,
            **schedule_args) -> tuple[dict, str]:
    """One analysis of a task-times file: (results, text). schedule_args: see stamps.schedule_for."""
    from ..runtime.profile import format_summary, summarize_times
    if what not in ANALYSES:
        raise ValueError(f"unknown analysis {what!r}; known: {', '.join(ANALYSES)}")
    ids, ts, meta = load_stamps(path)
    schedule = schedule_for(meta, **schedule_args)
    check_fits(schedule, ids, path)
    latencies = latencies or [1.0]
    if what == "replay":
        summary = summarize_times(schedule, ids, ts)
        res = {"summary": summary, **replay(schedule, ids, ts, latencies)}
        return res, format_summary(summary) + "\n" + format_replay(res)
    if what == "chain":
        res = chain_composition(schedule, body_us(schedule, ids, ts), latencies[0])
        return res, format_chain(res, latencies[0])
    res = phases_report(schedule, ids, ts, first_layers_n)
    return res, format_phases(res)


__all__ = ["ANALYSES", "PHASES", "analyze", "body_us", "chain_composition", "check_fits", "first_layers",
           "format_chain", "format_phases", "format_replay", "layer_phases", "load_stamps", "longest_path",
           "measured_overheads", "phases_report", "replay", "save_stamps", "schedule_for", "tail_spans",
           "weight_rate"]

"""`kogc inspect`: what the compiler made and where the time went, no GPU needed.

A build folder (`kogc compile ... --out DIR`): a summary (tasks per kind, bytes and predicted time per
program, the dependency chain per layer in the cost model, registers and spills), one task decoded, one
program's queue, one layer's task graph. A profiled step (`kogc bench --profile --task-times FILE`): a PNG
timeline per program, a Chrome/Perfetto trace, a roofline table per kind. Two builds or two profiles side
by side (`--diff`). Figures need matplotlib (`pip install 'kogc[inspect]'`). See docs/inspect.md.
"""
from __future__ import annotations

from .build import BuildSchedule, Inspected, from_schedule, load_build, load_kind_us, parse_ir
from .costs import as_scheduled, chain, layer_chains, per_program, task_us
from .diff import diff_builds, diff_profiles
from .plots import layer_graph, require_matplotlib, timeline, timeline_size, write_layer_graph
from .profiled import Profile, format_roofline, load_profile, roofline, trace_events, write_trace
from .text import decode_task, layer_groups, program_queue, summary

__all__ = ["BuildSchedule", "Inspected", "Profile", "as_scheduled", "chain", "decode_task", "diff_builds",
           "diff_profiles", "format_roofline", "from_schedule", "layer_chains", "layer_graph", "layer_groups",
           "load_build", "load_kind_us", "load_profile", "parse_ir", "per_program", "program_queue",
           "require_matplotlib", "roofline", "summary", "task_us", "timeline", "timeline_size", "trace_events",
           "write_layer_graph", "write_trace"]

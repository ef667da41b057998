"""`kogc inspect`: what the arguments ask for, in order (kogc.cli defines the options)."""
from __future__ import annotations

import sys

from ..errors import KogcError


def parse_programs(text: str | None, n: int) -> range | None:
    """--programs a:b (programs a..b-1; either end may be left out) or a single program."""
    if text is None:
        return None
    try:
        if ":" in text:
            a, b = text.split(":", 1)
            r = range(int(a) if a.strip() else 0, int(b) if b.strip() else n)
        else:
            r = range(int(text), int(text) + 1)
    except ValueError:
        raise KogcError(f"--programs must be a:b (programs a to b-1) or one program, got {text!r}") from None
    if not (0 <= r.start < r.stop <= n):
        raise KogcError(f"--programs {text}: must be a:b with 0 <= a < b <= {n} (the schedule has programs "
                        f"0..{n - 1})")
    return r


def parse_window(text: str | None, span: float) -> tuple[float, float] | None:
    """--window t0:t1 in us from the step's first start (either end may be left out)."""
    if text is None:
        return None
    try:
        a, b = text.split(":", 1)
        w = (float(a) if a.strip() else 0.0, float(b) if b.strip() else span)
    except ValueError:
        raise KogcError(f"--window must be t0:t1 in us, e.g. 0:200, got {text!r}") from None
    if not w[0] < w[1]:
        raise KogcError(f"--window {text}: t0 must be before t1")
    return w


def check_output(path: str | None, what: str, suffixes: tuple[str, ...] | None = None) -> None:
    """Refuse an output file before any work: a wrong suffix, or a folder that does not exist."""
    import os
    if path is None:
        return
    if suffixes and not path.lower().endswith(suffixes):
        raise KogcError(f"{what} {path}: give a file ending in {' or '.join(suffixes)}")
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise KogcError(f"{what} {path}: no folder {d}")


def _note(msg: str) -> None:
    print(msg, file=sys.stderr)


def run(args) -> int:
    from . import plots, text
    from .build import load_build, load_kind_us
    from .profiled import format_roofline, load_profile, roofline, write_trace

    kind_us = load_kind_us(args.kind_us) if args.kind_us else None
    if args.diff:
        return run_diff(args, kind_us)
    if args.build is None and args.profile is None:
        raise KogcError("nothing to inspect: give a BUILD_DIR, --profile FILE or --diff A B")
    profile_only = ("png", "trace", "window", "bandwidth", "context")
    for name in profile_only:
        if getattr(args, name) is not None and args.profile is None:
            raise KogcError(f"--{name} needs a profile: --profile FILE (kogc bench --profile --task-times FILE)")
    if args.graph and args.layer is None:
        raise KogcError("--graph draws one layer: give --layer I")
    if args.bandwidth is not None and not 0 < args.bandwidth <= 100:
        raise KogcError(f"--bandwidth is in TB/s (e.g. 4.05), got {args.bandwidth}")
    if args.context is not None and args.context < 0:
        raise KogcError(f"--context must be >= 0, got {args.context}")
    if args.width < 200 or args.row_px <= 0:
        raise KogcError("--width must be at least 200 pixels and --row-px more than 0")
    check_output(args.png, "--png", (".png",))
    check_output(args.trace, "--trace")
    check_output(args.graph, "--graph", (".svg", ".png", ".pdf", ".dot", ".gv"))
    if args.png:
        plots.require_matplotlib("the timeline (--png)")
    if args.graph and not args.graph.lower().endswith((".dot", ".gv")):
        plots.require_matplotlib(f"the layer graph (--graph {args.graph})")
    ins = load_build(args.build, kind_us) if args.build is not None else None
    prof = None
    if args.profile is not None:
        if ins is None:
            _note(f"[inspect] rebuilding the schedule {args.profile} records")
        ins, prof = load_profile(args.profile, ins, kind_us)
    s = ins.schedule
    programs = parse_programs(args.programs, len(s.queues))
    window = parse_window(args.window, prof.span_us) if prof is not None else None
    if args.task is not None:                    # every index checked before anything is printed
        text.check_index("--task", args.task, len(s.tasks), ins.where, "tasks")
    if args.program is not None:
        text.check_index("--program", args.program, len(s.queues), ins.where, "programs")
    if args.layer is not None:
        text.check_layer(ins, args.layer)
    view = args.task is not None or args.program is not None or args.layer is not None
    if args.task is not None:
        print(text.decode_task(ins, args.task, prof))
    if args.program is not None:
        print(text.program_queue(ins, args.program, prof))
    if args.layer is not None:
        print(text.layer_groups(ins, args.layer))
        if args.graph:
            res = plots.write_layer_graph(ins, args.layer, args.graph)
            _note(f"wrote {args.graph}: layer {args.layer}, {res['nodes']} groups and {res['external']} producers "
                  f"from outside, {res['edges']} edges ({res['format']})")
    if not view:
        print(text.summary(ins))
        if prof is not None:
            print()
            print(format_roofline(roofline(ins, prof, args.bandwidth and args.bandwidth * 1e12, args.context)))
    if prof is not None:
        if args.png:
            res = plots.timeline(ins, prof, args.png, programs, window, args.width, args.row_px)
            _note(f"wrote {args.png}: {res['size'][0]} x {res['size'][1]} px, {len(res['rows'])} programs, "
                  f"{res['bars']} bars")
        if args.trace:
            n = write_trace(ins, prof, args.trace, programs, window)
            _note(f"wrote {args.trace}: {n} slices on {len(programs or s.queues)} tracks (open in ui.perfetto.dev)")
    return 0


def run_diff(args, kind_us) -> int:
    from .build import load_build
    from .diff import diff_builds, diff_profiles, kind_of_input
    from .profiled import load_profile

    if args.build is not None or args.profile is not None:
        raise KogcError("--diff A B compares its two inputs: give no BUILD_DIR or --profile beside it")
    a, b = args.diff
    ka, kb = kind_of_input(a), kind_of_input(b)
    if ka != kb:
        raise KogcError(f"--diff compares two builds or two profiles: {a} is a {ka}, {b} a {kb}")
    if ka == "build":
        print(diff_builds(load_build(a, kind_us), load_build(b, kind_us)))
    else:
        ia, pa = load_profile(a, None, kind_us)
        ib, pb = load_profile(b, None, kind_us)
        print(diff_profiles(ia, pa, ib, pb))
    return 0

"""`kogc` command line. Every user error prints one line `kogc: error: ...` and exits with code 2."""
from __future__ import annotations

import argparse
import os
import sys
import time

from .errors import KogcError

EMITS = ("ir", "ir-json", "tasks", "schedule", "source")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kogc", description="Compile a PyTorch decoder into one persistent GPU kernel.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a model file for a target",
                       description="Trace the model of MODEL_FILE, lower it, and print a stage (--emit) "
                                   "or write the kernel and its reports (--out).")
    c.add_argument("model_file", help="a Python file defining kogc_model(...), e.g. examples/laneformer.py")
    c.add_argument("--target", required=True, help="h200 | mi300x")
    c.add_argument("--config", help="a preset of the model file, e.g. tiny | laneformer-2b")
    c.add_argument("--checkpoint", help="a directory with config.json and *.safetensors (instead of --config)")
    c.add_argument("--lanes", type=int, help="override the preset's num_lanes")
    c.add_argument("--emit", choices=EMITS, help="print this stage to stdout")
    c.add_argument("--out", help="write the compiled kernel, schedule and report to this directory")
    return p


def _fail(msg: str) -> int:
    print(f"kogc: error: {msg}", file=sys.stderr)
    return 2


def cmd_compile(args) -> int:
    from .frontend import to_ir
    from .frontend.model_file import build_model
    from .ir import to_json, to_text
    from .targets import get_target

    try:
        target = get_target(args.target)
    except KeyError as e:
        return _fail(e.args[0])
    if not args.emit and not args.out:
        return _fail("nothing to do: give --emit STAGE or --out DIR")
    if args.emit in ("tasks", "schedule", "source") or args.out:
        return _fail(f"{'--emit ' + args.emit if args.emit else '--out'} is not available yet: the scheduler and "
                     f"code generation are not built (only --emit ir and --emit ir-json work)")
    t0 = time.perf_counter()
    overrides = {"num_lanes": args.lanes} if args.lanes else {}
    # Shapes are all the IR needs: build on the meta device unless real weights come from a checkpoint.
    model = build_model(args.model_file, preset=args.config, checkpoint=args.checkpoint,
                        device="cpu" if args.checkpoint else "meta", seed=None, **overrides)
    graph = to_ir(model)
    graph.meta["target"] = target.name
    print(to_json(graph) if args.emit == "ir-json" else to_text(graph, sources=True))
    print(f"# traced and lowered in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"compile": cmd_compile}[args.command](args)
    except KogcError as e:
        return _fail(str(e))
    except BrokenPipeError:  # `kogc compile ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

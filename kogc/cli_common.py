"""What every `kogc` command shares: its one-line errors (exit code 2), progress lines on stderr, list and
settings options, and JSON output."""
from __future__ import annotations

import os
import sys
import time

from .errors import KogcError

OUTPUT_FILES = ("json", "task_times", "png", "trace", "graph")    # options naming a file a command writes (and --out)


def fail(msg: str) -> int:
    print(f"kogc: error: {msg}", file=sys.stderr)
    return 2


def print_progress(step: int, total: int, what: str, t0: float) -> None:
    print(f"[{step}/{total}] {what} ({time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True)


def print_stage_time(stage: str, seconds: float) -> None:
    """A schedule build's stage as it ends (build_schedule's progress)."""
    print(f"      scheduled: {stage} in {seconds:.1f}s", file=sys.stderr, flush=True)


def parse_ints(text: str, what: str) -> list[int]:
    """A comma-separated list of integers (a KogcError naming the option otherwise)."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise KogcError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not out:
        raise KogcError(f"{what} is empty")
    return out


def parse_floats(text: str, what: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise KogcError(f"{what} must be comma-separated numbers, got {text!r}") from None
    if not out or any(x < 0 for x in out):
        raise KogcError(f"{what} must be one or more numbers >= 0, got {text!r}")
    return out


def parse_tile_config(text: str | None):
    """--tile-config JSON -> a TileConfig (None: the defaults)."""
    from .scheduler.config import tile_config_from_json
    return tile_config_from_json(text) if text else None


def save_json(obj, path: str, quiet: bool = False) -> None:
    import json
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    if not quiet:
        print(f"wrote {path}", file=sys.stderr)


def use_interpreter(args) -> None:
    """--interpret: Triton's interpreter set up before anything imports Triton, which reads it once, at import
    (set later, it would only confuse a process that runs GPU kernels)."""
    if getattr(args, "interpret", False) and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def needs_gpu(args, what: str) -> int | None:
    """Refuse without a GPU unless --interpret."""
    import torch
    if not args.interpret and not torch.cuda.is_available():
        return fail(f"no GPU here: {what}")
    return None

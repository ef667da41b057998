"""Load a model from a user's Python file.

A model file defines `kogc_model(preset=None, checkpoint=None, device="cpu", dtype=None, seed=0)`
returning the decode-step module (see examples/laneformer.py), and optionally `PRESETS`.

The module may carry measured task times for kogc's placement as `module.kogc_placement`: a dict, or a
list of them, {"target": "h200", "tile_bytes": 32768, "kind_us": {task kind: microseconds}} (the mean
task bodies `kogc bench --profile` prints), optionally with "weights" (the format they were measured
with: "model", the default, or "fp8") and the placement settings that pair measured best with
("lane_group_stagger", "lane_homes", "cost_context", "place_latency_us":
kogc.scheduler.config.PLACEMENT_FIELDS). kogc.compile places with the one of its target, tile size and
weight format, for what the TileConfig leaves unset (kogc.settings.tile_config_for); the example ships
examples/profiles/laneformer-2b.h200.json and .h200.fp8.json and attaches them to that preset.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import torch

from ..errors import ModelFileError


def load_module(path: str):
    if not os.path.isfile(path):
        raise ModelFileError(f"{path}: no such file")
    name = "kogc_user_model_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ModelFileError(f"{path}: importing it failed: {type(e).__name__}: {e}") from None
    return module


def is_transformers_dir(path: str | None) -> bool:
    """A transformers model rather than a model file: a directory (config.json + safetensors, or a .gguf)
    or a .gguf file."""
    return bool(path) and (os.path.isdir(path) or path.endswith(".gguf"))


def build_for_tracing(path: str | None, preset: str | None = None, checkpoint: str | None = None,
                      **overrides) -> torch.nn.Module:
    """The model of `path` to capture only (its IR and schedule, no weights' values): on the meta device
    where shapes are all it needs (a model written for kogc), on the CPU where its position tables and masks
    are evaluated while it is captured (any other model) or where a checkpoint gives its weights."""
    from . import decode_step, written_for_kogc
    model = build_model(path, preset=preset, checkpoint=checkpoint, device="cpu" if checkpoint else "meta",
                        seed=None, **overrides)
    if not written_for_kogc(decode_step(model)) and any(t.is_meta for t in model.buffers()):
        model = build_model(path, preset=preset, checkpoint=checkpoint, device="cpu", seed=None, **overrides)
    return model


def build_model(path: str | None, preset: str | None = None, checkpoint: str | None = None, device: str = "cpu",
                dtype: torch.dtype | None = None, seed: int | None = 0, model_dir: str | None = None,
                max_len: int | None = None, **overrides) -> torch.nn.Module:
    """The model of `path` from a preset (random weights from `seed`) or a checkpoint directory; or,
    with `model_dir`, or a directory or .gguf file as `path`, a transformers causal LM as its decode step
    (kogc.frontend.hf; its KV cache has `max_len` positions, also given as overrides["max_len"]).

    device="meta" with seed=None builds shapes only (no memory), enough to trace and print the IR."""
    max_len = overrides.pop("max_len", None) or max_len
    if model_dir or is_transformers_dir(path):
        from .transformers_dir import load_decode_step
        if overrides:
            raise ModelFileError(f"{', '.join(overrides)}: a preset's fields, not for a transformers model")
        # (the position tables and masks are computed from real tensors: never on the meta device)
        return load_decode_step(model_dir or path, device="cpu" if device == "meta" else device, dtype=dtype,
                                max_len=max_len)
    if path is None:
        raise ModelFileError("no model: give MODEL_FILE (with --config or --checkpoint) or --model-dir DIR")
    if max_len:             # a model file takes it as kogc_model(max_len=...), if it knows it
        overrides["max_len"] = max_len
    module = load_module(path)
    entry = getattr(module, "kogc_model", None)
    if not callable(entry):
        raise ModelFileError(f"{path}: no model in it (define kogc_model(preset, checkpoint, device, dtype, seed) "
                             f"returning the decode-step nn.Module)")
    presets = getattr(module, "PRESETS", None)
    if checkpoint is None:
        if preset is None:
            known = f" (its presets: {', '.join(presets)})" if presets else ""
            raise ModelFileError(f"{path}: give --config PRESET{known} or --checkpoint DIR")
        if presets is not None and preset not in presets:
            raise ModelFileError(f"unknown preset {preset!r} for {path}; known: {', '.join(presets)}")
    elif not os.path.isdir(checkpoint):
        raise ModelFileError(f"checkpoint {checkpoint}: no such directory")
    try:
        model = entry(preset=preset, checkpoint=checkpoint, device=device, dtype=dtype, seed=seed, **overrides)
    except (KeyError, ValueError, TypeError, FileNotFoundError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise ModelFileError(f"{path}: {msg}") from None
    if not isinstance(model, torch.nn.Module):
        raise ModelFileError(f"{path}: kogc_model returned {type(model).__name__}, not an nn.Module")
    return model

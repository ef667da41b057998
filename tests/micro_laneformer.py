"""A model file for the CLI tests that run the kernel under Triton's interpreter: the example
Laneformer cut to one lane and one or two layers (an interpreted step of `tiny` takes seconds)."""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import laneformer as lf  # noqa: E402

PRESETS = {"micro": dataclasses.replace(lf.PRESETS["tiny"], num_lanes=1, num_hidden_layers=1),
           "micro2": dataclasses.replace(lf.PRESETS["tiny"], num_lanes=1, num_hidden_layers=2)}


def kogc_model(preset=None, checkpoint=None, device="cpu", dtype=None, seed=0, **overrides):
    if checkpoint:
        return lf.load_checkpoint(checkpoint, device=device, dtype=dtype)
    if preset not in PRESETS:
        raise KeyError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    return lf.build(dataclasses.replace(PRESETS[preset], **overrides), device=device, dtype=dtype, seed=seed)

"""Targets as data. `get_target("h200")`, `get_target("h100")` or `get_target("mi300x")`; `target_for_device`
fits one to the GPU at hand (its SM count, register file, L2 and memory)."""
from .amd_mi300x import MI300X
from .base import Target
from .device import target_for_device
from .nvidia_h100 import H100
from .nvidia_h200 import H200

TARGETS = {t.name: t for t in (H200, H100, MI300X)}
ALIASES = {"nvidia_h200": "h200", "h200": "h200", "nvidia_h100": "h100", "h100": "h100",
           "amd_mi300x": "mi300x", "mi300x": "mi300x"}


def get_target(name: str) -> Target:
    """The target's description as data (pure: no device is asked; see target_for_device)."""
    key = ALIASES.get(name.lower())
    if key is None:
        raise KeyError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[key]


__all__ = ["Target", "TARGETS", "get_target", "target_for_device", "H200", "H100", "MI300X"]

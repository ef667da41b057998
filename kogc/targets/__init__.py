"""Targets as data. `get_target("h200")` or `get_target("mi300x")`."""
from .amd_mi300x import MI300X
from .base import Target
from .nvidia_h200 import H200

TARGETS = {t.name: t for t in (H200, MI300X)}
ALIASES = {"nvidia_h200": "h200", "h200": "h200", "amd_mi300x": "mi300x", "mi300x": "mi300x"}


def get_target(name: str) -> Target:
    key = ALIASES.get(name.lower())
    if key is None:
        raise KeyError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[key]


__all__ = ["Target", "TARGETS", "get_target", "H200", "MI300X"]

"""Scheduler: IR -> tasks with exact dependencies -> one queue per program, proven sound."""
from .errors import SchedulerError
from .schedule import Schedule, build_schedule
from .tile import TileConfig

__all__ = ["Schedule", "build_schedule", "TileConfig", "SchedulerError"]

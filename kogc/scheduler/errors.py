class SchedulerError(Exception):
    """The IR cannot be scheduled, or a schedule failed its soundness check (names task and wait)."""

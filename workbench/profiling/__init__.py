"""Profiler capture (record="full"): the session, its events by step, and its cost per event."""

from .capture import (
    ALL_REDUCES,
    MIN_CPU_OP_NS,
    SKEW_US,
    Capture,
    Event,
    StepEvents,
    assign_to_steps,
    host_events_by_step,
    read_events,
)
from .cost import event_cost_us
from .session import (
    ProfilerSession,
    activities,
    gc_paused,
    release_cupti_at_stop,
    session_running,
    session_seconds,
)

__all__ = [
    "ALL_REDUCES",
    "MIN_CPU_OP_NS",
    "SKEW_US",
    "Capture",
    "Event",
    "ProfilerSession",
    "StepEvents",
    "activities",
    "assign_to_steps",
    "event_cost_us",
    "gc_paused",
    "host_events_by_step",
    "read_events",
    "release_cupti_at_stop",
    "session_running",
    "session_seconds",
]

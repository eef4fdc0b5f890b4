"""Profiler capture (record="full"): one torch.profiler session over many steps (`session.py`),
its events flattened to (name, category, track, start_us, duration_us) on the clock it is given
and each event's step (`events.py`), and what the profiler adds to the host per event it records
(`cost.py`: a profiled step's own distortion). Rank 0's probe uses it (`instrument/profiler.py`
names its hook ranges), and so does every tensor-parallel rank above 0
(`engine/rank_profiler.py`), which is why it sits below both."""

from .cost import event_cost_us
from .events import (
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

"""Production request traces, replayed: `load` a trace (Azure's, Mooncake's, or a plain CSV or
JSON lines of arrival seconds and lengths), run it (`Workbench.add_trace`, `compare(settings,
requests=trace)`, `bench --dataset-name mooncake`), and set the run's prefix-cache hits beside
the trace's own ideal (`prefix_reuse`; against the KV pool's size, `pool_reuse` of
`workbench.pool_sweep`'s runs)."""

from .formats import FORMATS
from .ideal import Reuse
from .load import NAMES, load
from .pool import pool_reuse
from .request import TraceRequest
from .reuse import prefix_reuse
from .trace import Trace

__all__ = [
    "FORMATS",
    "NAMES",
    "Reuse",
    "Trace",
    "TraceRequest",
    "load",
    "pool_reuse",
    "prefix_reuse",
]

"""What describes a run: the step records, the tables built from them, the run file, the latency,
timing and roofline definitions, kernel families and the trace export. No engine, no views."""

from ..scheduler.record import KVState, LedgerRow, StepRecord
from .history import History, RunTables

__all__ = ["History", "KVState", "LedgerRow", "RunTables", "StepRecord"]

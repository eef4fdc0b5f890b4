"""What describes a run: the step records, the tables built from them (steps, ledger,
requests, admissions, events, pages), the run file, latency and roofline definitions, kernel
families and the Chrome trace export. Nothing here needs the engine or the views."""

from .history import History, RunTables
from .record import KVState, LedgerRow, StepRecord

__all__ = ["History", "KVState", "LedgerRow", "RunTables", "StepRecord"]

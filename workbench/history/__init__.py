"""What describes a run: step records, the tables built from them and their definitions."""

from ..scheduler.record import KVState, LedgerRow, StepRecord
from .history import History, RunTables

__all__ = ["History", "KVState", "LedgerRow", "RunTables", "StepRecord"]

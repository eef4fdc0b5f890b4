"""The step record, made by the scheduler, re-exported beside the tables built from it."""

from ..scheduler.record import KVState, LedgerRow, StepRecord, StepRecords

__all__ = ["KVState", "LedgerRow", "StepRecord", "StepRecords"]

"""The step record, as the history keeps it: made by the scheduler (`scheduler/record.py`),
where a step is launched and collected; re-exported here, beside the tables built from it."""

from ..scheduler.record import KVState, LedgerRow, StepRecord, StepRecords

__all__ = ["KVState", "LedgerRow", "StepRecord", "StepRecords"]

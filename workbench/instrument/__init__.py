"""Instrumentation: hook points, step records and the run history."""

from .history import History, RunHistory, load_run
from .hooks import HOOK_POINTS, HookError, HookHandle, HookRegistry
from .record import KVState, LedgerRow, StepRecord

__all__ = [
    "HOOK_POINTS",
    "History",
    "HookError",
    "HookHandle",
    "HookRegistry",
    "KVState",
    "LedgerRow",
    "RunHistory",
    "StepRecord",
    "load_run",
]

"""Instrumentation of a running engine: the probe, the hook points and their events, the
profiler session and the page-table snapshots. What a finished run is made of (records, tables,
run files) is in `workbench.history`."""

from .hooks import HOOK_POINTS, HookError, HookHandle, HookRegistry

__all__ = ["HOOK_POINTS", "HookError", "HookHandle", "HookRegistry"]

"""Instrumentation of a running engine: the probe, hook points, profiler and page snapshots."""

from .hooks import HOOK_POINTS, HookError, HookHandle, HookRegistry

__all__ = ["HOOK_POINTS", "HookError", "HookHandle", "HookRegistry"]

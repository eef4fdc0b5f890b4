"""Scheduling: the loop (`Scheduler`), its observer, the cache manager, prefill admission, the
decode set, batch preparation, early ends and step outcomes."""

from .observer import Observer
from .outcome import StepError, StepOutcome
from .scheduler import Scheduler

__all__ = ["Observer", "Scheduler", "StepError", "StepOutcome"]

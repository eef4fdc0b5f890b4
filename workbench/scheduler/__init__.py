"""Scheduling: the loop, its observer, the cache manager, admission and the step's record."""

from .observer import Observer
from .record import StepRecord
from .scheduler import Scheduler, StepError

__all__ = ["Observer", "Scheduler", "StepError", "StepRecord"]

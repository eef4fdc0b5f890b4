"""workbench: an instrumented LLM inference engine you can step through in a notebook."""

from .core import SamplingParams
from .instrument.history import load_run
from .llm import LLM
from .scheduler.outcome import StepError
from .workbench import Workbench

__all__ = ["LLM", "SamplingParams", "StepError", "Workbench", "load_run"]
__version__ = "0.1.0"

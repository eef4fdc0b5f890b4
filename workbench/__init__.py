"""workbench: an instrumented LLM inference engine you can step through in a notebook."""

from .core import SamplingParams
from .llm import LLM
from .runs import load_run
from .scheduler.outcome import StepError
from .workbench import Workbench

__all__ = ["LLM", "SamplingParams", "StepError", "Workbench", "load_run"]
__version__ = "0.1.0"

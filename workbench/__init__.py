"""workbench: an instrumented LLM inference engine you can step through in a notebook."""

from .core import SamplingParams
from .llm import LLM
from .runs import load_run
from .scheduler import StepError
from .twin import StepCosts, fit_step_costs, load_step_costs, validate_twin
from .workbench import Workbench

__all__ = [
    "LLM",
    "SamplingParams",
    "StepCosts",
    "StepError",
    "Workbench",
    "fit_step_costs",
    "load_step_costs",
    "load_run",
    "validate_twin",
]
__version__ = "0.1.0"

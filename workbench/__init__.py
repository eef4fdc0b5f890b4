"""workbench: an instrumented LLM inference engine you can step through in a notebook."""

from .core import SamplingParams
from .llm import LLM

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"

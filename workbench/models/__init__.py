"""Models: configs, the decoder, weight loading and the catalog of names."""

from .catalog import cache_root, names, resolve
from .config import ModelConfig

__all__ = ["ModelConfig", "cache_root", "names", "resolve"]

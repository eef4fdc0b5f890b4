"""The engine: the model, KV pool and request table on one device (or one rank of several)."""

from .engine import Engine, Launch

__all__ = ["Engine", "Launch"]

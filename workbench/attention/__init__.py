"""Attention backends behind one interface: `torch` (the reference), `flashinfer` (GPU)."""

from .base import BACKENDS, AttentionBackend, create_backend

__all__ = ["BACKENDS", "AttentionBackend", "create_backend"]

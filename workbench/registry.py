"""Registries of named implementations: name -> "module:Class", imported on first use so a
GPU-only backend costs nothing elsewhere."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def create(registry: Mapping[str, str], what: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """An instance of the class registered under `name`; `what` names the registry in errors."""
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; expected one of {sorted(registry)}")
    module, cls = registry[name].split(":")
    return getattr(importlib.import_module(module), cls)(*args, **kwargs)

"""Validation at the boundary: each check returns the value as plain Python, or raises
`WrongType` (a `TypeError`: wrong kind) or `ValueError` (out of range) naming the parameter.
Types are strict: a bool or a whole float is not an integer; numpy and torch integer scalars are.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


class WrongType(TypeError):
    """A `TypeError` a check raised about a value given: its message names the parameter, the
    value and what is allowed, so the command line says it as a bad flag (where any other
    `TypeError`, a bug, keeps its traceback)."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: Any) -> str:
    kind = type(value).__name__
    return f"{_show(value)} ({'an' if kind[:1] in 'aeiouAEIOU' else 'a'} {kind})"


def _as_integer(value: Any) -> int | None:
    """The int behind `value`, or None when it is not an integer (bools are not)."""
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if _is_tensor(value) and value.ndim == 0 and not value.is_floating_point():
        return None if value.dtype == _torch().bool else int(value.item())
    return None


def integer(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """An integer in [low, high] (either bound optional)."""
    number = _as_integer(value)
    if number is None:
        raise WrongType(f"{name} must be an integer{_range(low, high)}, got {_kind(value)}")
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(f"{name} must be an integer{_range(low, high)}, got {_show(value)}")
    return number


def optional_integer(name: str, value: Any, low: int | None = None, high: int | None = None):
    return None if value is None else integer(name, value, low, high)


def real(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    allowed: str | None = None,
) -> float:
    """A finite real number in [low, high] (or (low, high] with `low_open`)."""
    allowed = allowed or _interval(low, high, low_open)
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise WrongType(f"{name} must be a number {allowed}, got {_kind(value)}")
    number = float(value)
    below = low is not None and (number <= low if low_open else number < low)
    if not math.isfinite(number) or below or (high is not None and number > high):
        raise ValueError(f"{name} must be a finite number {allowed}, got {_show(value)}")
    return number


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise WrongType(f"{name} must be True or False, got {_kind(value)}")
    return bool(value)


def optional_boolean(name: str, value: Any) -> bool | None:
    return None if value is None else boolean(name, value)


def choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str):  # the wrong kind, as docs/engine.md says
        raise WrongType(f"{name} must be one of {tuple(choices)}, got {_kind(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {_show(value)}")
    return value


def mapping(name: str, value: Any) -> Mapping:
    if not isinstance(value, Mapping):
        raise WrongType(f"{name} must be a mapping (a dict), got {_kind(value)}")
    return value


def callable_or_none(name: str, value: Any) -> Callable | None:
    if value is not None and not callable(value):
        raise WrongType(f"{name} must be a function or None, got {_kind(value)}")
    return value


def function_of_one(name: str, value: Any, of: str) -> Callable:
    """A function callable with one argument (`of` says what it is given)."""
    if not callable(value):
        raise WrongType(f"{name} must be a function of {of}, got {_kind(value)}")
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # (some builtins have none: take them at their word)
        return value
    try:
        signature.bind(None)
    except TypeError:
        raise WrongType(
            f"{name} must be a function of one argument ({of}), got {_show(value)} whose "
            f"signature is {signature}"
        ) from None
    return value


def token_ids(name: str, value: Any, vocab_size: int) -> list[int]:
    """A prompt given as token ids: a list or tuple of integers, or a 1-d integer array
    (numpy or torch), each in [0, vocab_size)."""
    if _is_array(value):
        if value.ndim != 1 or _array_kind(value) != "int":
            raise WrongType(
                f"{name} must be a 1-d array of integer token ids, got a {value.ndim}-d "
                f"{_array_kind(value)} array"
            )
        ids = [int(t) for t in value.tolist()]
    elif isinstance(value, list | tuple):
        if set(map(type, value)) <= {int}:  # the common case, without Python code per token
            ids = list(value)
        else:
            ids = []
            for i, t in enumerate(value):
                number = _as_integer(t)
                if number is None:
                    raise WrongType(f"{name} must hold integer token ids; item {i} is {_kind(t)}")
                ids.append(number)
    else:
        raise WrongType(
            f"{name} must be a string or token ids (a list, tuple or 1-d integer array), "
            f"got {_kind(value)}"
        )
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        raise ValueError(
            f"{name} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
        )
    return ids


def text(name: str, value: str) -> str:
    """A string that is not empty and encodes as UTF-8 (no lone surrogates)."""
    if not value:
        raise ValueError(f"{name} is empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} is not valid text: {exc}") from None
    return value


def prompt_batch(value: Any) -> list[Any]:
    """The prompts of one call as a list: a string or token ids is one prompt; a list or tuple
    of them, or a 2-d integer array (a row per prompt), is a batch."""
    if isinstance(value, str):
        return [value]
    if _is_array(value):
        if value.ndim == 1:
            return [value]
        if value.ndim == 2:
            return list(value)
        raise WrongType(f"prompts as an array must be 1-d or 2-d, got {value.ndim}-d")
    if isinstance(value, list | tuple):
        if value and (
            all(type(t) is int for t in value) or all(_as_integer(t) is not None for t in value)
        ):
            return [value]  # one prompt of token ids
        if any(_as_integer(t) is not None for t in value):  # (a batch holds no integer)
            if all(isinstance(t, numbers.Number) or _is_tensor(t) for t in value):
                return [value]  # token ids, some not integers: its check names which
            raise WrongType(
                f"prompts mixes token ids with other things, got {_show(value)}: one prompt of "
                "token ids is a list of integers, a batch a list of prompts (texts or such lists)"
            )
        return list(value)
    raise WrongType(
        "prompts must be a string, token ids, or a list of strings and token ids, got "
        f"{_kind(value)}"
    )


def _range(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    if low is not None:
        return f" >= {low}"
    return "" if high is None else f" <= {high}"


def _interval(low: float | None, high: float | None, low_open: bool) -> str:
    if low is None and high is None:
        return "(any finite value)"
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"<= {high}"
    return f"in {'(' if low_open else '['}{low}, {high}]"


def _torch():
    import torch

    return torch


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "ndim")


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or _is_tensor(value)


def _array_kind(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.dtype == np.bool_:
            return "bool"
        return "int" if np.issubdtype(value.dtype, np.integer) else str(value.dtype)
    torch = _torch()
    if value.dtype == torch.bool:
        return "bool"
    if value.is_floating_point() or value.is_complex():
        return str(value.dtype).removeprefix("torch.")
    return "int"


def unknown_keyword(
    where: str, name: str, known: Sequence[str], hints: Mapping[str, str]
) -> WrongType:
    """The error for keyword `name`, which `where` does not take: its hint (what another
    library's name is here) where `hints` has one, else the keywords `where` takes."""
    if name in hints:
        return WrongType(f"{where} has no keyword {name!r}: {hints[name]}")
    return WrongType(f"{where} has no keyword {name!r}; it takes {', '.join(known)}")

"""Requests and settings given at once (`Workbench.compare`): each checked before any runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import validate as V
from .core import SamplingParams
from .llm import LLM
from .traces import Trace


def checked_requests(
    llm: LLM, requests: Sequence[tuple] | Trace, arrival: str = "step"
) -> list[tuple]:
    """``(prompt, sampling[, arrival])`` tuples, or a trace's requests (`Trace.to_requests`:
    arriving at their times, whatever `arrival` says), as ``(token_ids, sampling, arrival_step,
    arrival_time)``; raises on the first bad one."""
    by_time = V.choice("arrival", arrival, ("step", "time")) == "time"
    if isinstance(requests, Trace):
        requests, by_time = requests.to_requests(llm.engine.model_config.vocab_size), True
    if isinstance(requests, str | bytes) or not isinstance(requests, Sequence):
        raise TypeError(
            "requests must be a list of (prompt, sampling[, arrival]) tuples or a Trace, got "
            f"{requests!r:.80}"
        )
    if not requests:
        raise ValueError(
            "requests is empty: give at least one (prompt, sampling[, arrival]) tuple, or None "
            "for the requests added since the last reset"
        )
    checked = []
    for i, request in enumerate(requests):
        if not isinstance(request, tuple) or len(request) not in (2, 3):
            raise TypeError(
                f"requests[{i}] must be (prompt, sampling) or (prompt, sampling, {arrival}), "
                f"got {request!r}"
            )
        prompt, sampling, at = (*request, 0)[:3]
        sampling = sampling if sampling is not None else SamplingParams()
        ids = llm.encode(prompt, i)
        llm.check_request(ids, sampling, i)
        if by_time:
            checked.append((ids, sampling, 0, V.real(f"requests[{i}] arrival time", at, 0.0)))
        else:
            checked.append((ids, sampling, V.integer(f"requests[{i}] arrival_step", at, 0), None))
    return checked


def checked_settings(llm: LLM, settings: Mapping[str, Mapping[str, Any]]) -> dict[str, dict]:
    checked, settings = {}, V.mapping("settings", settings)
    if not settings:
        raise ValueError("settings is empty: give at least one, e.g. {'chunk 256': {}}")
    for name, options in settings.items():
        if str(name) in checked:  # (names are shown as text: 1 and "1" would be one run)
            raise ValueError(
                f"settings names {name!r} twice (as {str(name)!r}): give each a name of its own"
            )
        checked[str(name)] = dict(V.mapping(f"settings[{name!r}]", options))
        llm.check_settings(**checked[str(name)])
    return checked

"""A list of requests given at once (`Workbench.compare`): each checked before any runs."""

from __future__ import annotations

from collections.abc import Sequence

from . import validate as V
from .core import SamplingParams
from .llm import LLM


def checked_requests(llm: LLM, requests: Sequence[tuple]) -> list[tuple]:
    """``(prompt, sampling)`` or ``(prompt, sampling, arrival_step)`` tuples as
    ``(token_ids, sampling, arrival_step)``; raises TypeError or ValueError naming the first bad
    one, before anything is queued."""
    checked = []
    for i, request in enumerate(requests):
        if not isinstance(request, tuple) or len(request) not in (2, 3):
            raise TypeError(
                f"requests[{i}] must be (prompt, sampling) or (prompt, sampling, arrival_step), "
                f"got {request!r}"
            )
        prompt, sampling, arrival = (*request, 0)[:3]
        sampling = sampling if sampling is not None else SamplingParams()
        ids = llm.encode(prompt, i)
        llm.check_request(ids, sampling, i)
        checked.append((ids, sampling, V.integer(f"requests[{i}] arrival_step", arrival, 0)))
    return checked

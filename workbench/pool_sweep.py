"""A trace replayed once per KV pool size (`pool_sweep`), for its prefix-cache hit rate against
the pool (`traces.pool_reuse`). The pool's size is the engine's, not the scheduler's, so each
size is a new engine: cheap on a twin, which builds no model."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import validate as V
from .core import SamplingParams
from .runs import RunHistory
from .traces import Trace
from .workbench import Workbench


def pool_sweep(
    trace: Trace,
    num_pages: Iterable[int],
    model: str,
    *,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    **options: Any,
) -> dict[int, RunHistory]:
    """`trace` replayed at its arrival times on a new `Workbench(model, num_pages=n, **options)`
    for each pool size `n` (pages of the engine's page size), smallest first; the runs by pool
    size, for `traces.pool_reuse(runs, trace)`. `step_costs` among `options` makes each a twin.
    Prompts as `Workbench.add_trace` makes them (`sampling`, `seed`)."""
    if not isinstance(trace, Trace):
        raise TypeError(f"pool_sweep takes a Trace (workbench.traces.load), got {trace!r}")
    if isinstance(num_pages, str | bytes) or not isinstance(num_pages, Iterable):
        raise TypeError(f"num_pages must be pool sizes in pages ([256, 1024]), got {num_pages!r}")
    sizes = sorted({V.integer("num_pages", n, 1) for n in num_pages})
    if not sizes:
        raise ValueError("num_pages is empty: give the pool sizes to sweep, in pages")
    if options.get("record") == "off":
        raise ValueError(
            "record='off' keeps no requests table, whose cached tokens are the hits: leave record "
            "out (light) or give 'full'"
        )
    runs = {}
    for n in sizes:
        wb = Workbench(model, num_pages=n, **options)
        try:
            try:
                wb.add_trace(trace, sampling=sampling, seed=seed)
            except ValueError as exc:  # a request longer than the pool holds
                raise ValueError(f"num_pages={n}: {exc}") from exc
            wb.run(progress=False)
            runs[n] = wb.snapshot(run=f"{n} pages")
        finally:
            wb.close()
    return runs

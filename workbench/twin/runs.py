"""The recorded runs a twin learns from and is checked against: named, of one setup."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def named_runs(runs) -> dict[str, Any]:
    """`runs` as name -> history: one history (live or loaded), a list of them (named by their
    meta's "run", else "run N"; a second run of a name taken adds " (run N)", the same run
    given twice counts once), or a mapping; a `Workbench` or `LLM` stands for its history."""
    if isinstance(runs, str | os.PathLike):
        raise TypeError(
            f"runs: {str(runs)!r} is a path; give run histories (load_run(path) reads a saved "
            "one), a list of them or a mapping of names to them"
        )
    if isinstance(runs, Mapping):
        named = dict(runs)
    elif hasattr(runs, "steps") or hasattr(runs, "history"):
        named = {_name(runs, 0): runs}
    elif not isinstance(runs, list | tuple):  # (a DataFrame iterates its column names)
        raise TypeError(
            "runs must be a run history (live, or from load_run), a list of them or a mapping "
            f"of names to them, got {type(runs).__name__} {runs!r:.60}"
        )
    else:
        named = {}
        for i, run in enumerate(runs):
            name = _name(run, i)
            if name in named and named[name] is not run:  # two runs under one name: both count
                name = f"{name} (run {i})"
            named.setdefault(name, run)
    if not named:
        raise ValueError("no runs given")
    return {name: _history(run, name) for name, run in named.items()}


def _name(run, i: int) -> str:
    meta = getattr(getattr(run, "history", run), "meta", None) or {}
    return str(meta.get("run", f"run {i}"))


def _history(run, name: str):
    history = getattr(run, "history", run)  # a Workbench or an LLM
    if not hasattr(history, "steps") or not hasattr(history, "meta"):
        raise TypeError(f"run {name!r} is not a run history (live, or from load_run): {run!r}")
    if not len(history.steps):
        record = history.meta.get("record")
        why = "it ran with record='off'" if record == "off" else "it recorded no step"
        raise ValueError(
            f"run {name!r} has no step records ({why}): a twin learns from and is checked "
            "against runs recorded with record='light' or 'full'"
        )
    return history


def setup_of(history, keys: tuple[str, ...], name: str = "the run") -> dict[str, Any]:
    """The run's recorded setup: `keys` of its meta (`device_name` falls back to `device`)."""
    meta = dict(history.meta)
    meta.setdefault("device_name", meta.get("device"))
    missing = [k for k in keys if meta.get(k) is None]
    if missing:
        raise ValueError(
            f"{name} does not say its {missing} (its meta has {sorted(history.meta)}): record "
            "it with this workbench (a Workbench's history, or a run it saved)"
        )
    return {k: meta[k] for k in keys}


def check_same_setup(named: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The setup the runs share; a ValueError naming the first run that differs and how."""
    first_name, *others = named
    setup = setup_of(named[first_name], keys, f"run {first_name!r}")
    for name in others:
        other = setup_of(named[name], keys, f"run {name!r}")
        differ = {k: other[k] for k in keys if other[k] != setup[k]}
        if differ:
            raise ValueError(
                f"step costs are fitted on runs of one model on one device: run {name!r} has "
                f"{differ}, run {first_name!r} has { {k: setup[k] for k in differ} }"
            )
    return setup


def shared_kernels(named: dict[str, Any]) -> dict | None:
    """The kernels every run ran (their meta's "kernels"); None when a run does not say; a
    ValueError naming two runs that ran different ones (one fit would blend their costs)."""
    said = {name: history.meta.get("kernels") for name, history in named.items()}
    if any(kernels is None for kernels in said.values()):
        return None
    (first, kernels), *others = said.items()
    for name, other in others:
        differ = {k: v for k, v in other.items() if kernels.get(k) != v}
        if differ:
            raise ValueError(
                f"step costs are fitted on runs of the same kernels: run {name!r} ran {differ}, "
                f"run {first!r} ran { {k: kernels.get(k) for k in differ} }"
            )
    return dict(kernels)


def steps_of(named: dict[str, Any]):
    """The measured steps of every run, in one table (a `run` column says whose)."""
    import pandas as pd

    frames = []
    for name, history in named.items():
        steps = history.steps
        if "simulated" in steps and steps.simulated.any():
            raise ValueError(f"run {name!r} was simulated: fit step costs on measured runs")
        frames.append(steps.assign(run=name))
    steps = pd.concat(frames, ignore_index=True)
    return steps[steps.device_ms.notna() & (steps.device_ms > 0)].reset_index(drop=True)

"""Step costs: what one step of a model costs on a device, fitted from recorded runs.

`fit_step_costs(runs)` reads the steps tables of runs of one model on one device and fits, per
path (`features.PATHS`), the device time and each host stage's time as a sum of non-negative
costs per feature (`features.py`: a constant per kind of step, per request, per thousand tokens, per
million prompt attention pairs, per thousand KV tokens read, ...), plus the host's time between
two scheduler steps. A CUDA graph's device time has a part of its own besides: each captured
shape runs kernels chosen for its size (a decode graph of one request took 1.62 ms on the H200
where the fit over all sizes said 1.54), so each shape the runs replayed often enough keeps the
median ratio of its steps' device time to the fit's (`shapes`); a decode graph they did not
replay takes the factor of the nearest size they did, a prompt graph the fit alone. It says
what it learnt (`summary()`, or print it) and how far each phase's steps are from it;
`save(path)` and `load_step_costs(path)` keep it as JSON. A twin (`Workbench(model,
step_costs=costs)`) runs on it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..clocks import HOST_STAGES
from .coverage import MIN_SHAPE_STEPS, shape_factor, uncalibrated
from .features import (
    DEVICE_FEATURES,
    HOST_FEATURES,
    KNEE,
    PATHS,
    UNITS,
    shape_keys,
    step_features,
)
from .fit import robust_nnls
from .runs import check_same_setup, named_runs, steps_of

VERSION = 1
_FORWARD, _SAMPLE = HOST_STAGES.index("forward"), HOST_STAGES.index("sample")
# the paths whose costs a path the runs never took uses, in turn
_STANDS_IN = {"graph": ("eager",), "prompt_graph": ("eager",), "eager": ("prompt_graph",)}
# what a twin takes from the runs it was fitted on (the recorded engine's setup)
SETUP = ("model", "device", "device_name", "dtype", "tp_size")
_CONSTANT = frozenset({"1", "prompt", "decode"})  # features that are the same on every step


@dataclass(frozen=True)
class Linear:
    """A time (ms) as a sum of non-negative costs, one per feature."""

    features: tuple[str, ...]
    coef: tuple[float, ...]

    def __call__(self, f: Mapping[str, float]) -> float:
        return sum(c * f[name] for name, c in zip(self.features, self.coef))


@dataclass(frozen=True)
class StepCosts:
    """A model of one step's device and host time (ms), per path; see the module."""

    meta: dict[str, Any]  # the recorded setup (`SETUP`), the KV pool, the runs it came from
    device: dict[str, Linear]  # path -> device ms
    host: dict[str, dict[str, Linear]]  # path -> host stage -> ms
    between_ms: float  # host time between two scheduler steps (the loop around them)
    errors: list[dict] = field(default_factory=list)  # per phase: how far its steps are
    # graph path -> captured shape (`shape_keys`) -> real device ms / the fit's, median
    shapes: dict[str, dict[str, float]] = field(default_factory=dict)
    # path -> device feature -> (lowest, highest) over the calibration steps of that path
    ranges: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    # graph path -> captured shape -> how many calibration steps replayed it
    shape_steps: dict[str, dict[str, int]] = field(default_factory=dict)

    def predict(self, f: Mapping[str, float]) -> tuple[float, tuple[float, ...]]:
        """A step's device ms and host ms per stage (`HOST_STAGES` order) from its features
        (`features.batch_features`)."""
        device, host = self._times(f["path"], f)
        return float(device), host

    def predict_steps(self, steps) -> tuple[np.ndarray, np.ndarray]:
        """Device ms and host ms of each step of a steps table (its recorded composition)."""
        features = step_features(steps)
        device, host = np.zeros(len(steps)), np.zeros(len(steps))
        for path in PATHS:
            rows = (features.path == path).to_numpy()
            if rows.any():
                f = {c: features[c].to_numpy()[rows] for c in features.columns}
                device[rows], stages = self._times(path, f)
                host[rows] = sum(stages)
        return device, host

    def _times(self, path: str, f) -> tuple:
        """Device ms (at least the host's enqueueing: its forward and sample stages) and host ms
        per stage, of one step's features or of arrays of them; a path the runs never took
        uses another's costs (a prompt step's, those of the other path of prompt steps)."""
        fit = next((p for p in (path, *_STANDS_IN[path]) if p in self.device), None)
        fit = fit or next(iter(self.device))
        host = tuple(self.host[fit][s](f) for s in HOST_STAGES)
        device = self.device[fit](f) * self._shape_factor(path, f)
        return np.maximum(device, host[_FORWARD] + host[_SAMPLE]), host

    def _shape_factor(self, path: str, f):
        """The captured shape's factor on the fit (`coverage.shape_factor`; 1 off the graph
        paths), of one step or of arrays of them."""
        factors = self.shapes.get(path)
        if not factors:
            return 1.0
        keys = shape_keys(path, f["rows"], f["tokens"])
        if isinstance(keys, str):
            return shape_factor(path, factors, keys)
        return np.array([shape_factor(path, factors, k) for k in keys])

    def uncalibrated(self, steps) -> np.ndarray:
        """Per step of a steps table: what the calibration runs did not cover in its
        composition, "" where they did (`coverage.uncalibrated`)."""
        return uncalibrated(steps, self.device, self.ranges, self.shape_steps)

    # -- what it says ---------------------------------------------------------------------
    def summary(self) -> str:
        """What the costs say, per path a small table: a row for the device and one per host
        stage, a column per unit of the step's composition, each cell the ms one unit costs."""
        m = self.meta
        lines = _wrapped(
            f"step costs of {m['model']} on {m['device_name']} ({m['dtype']}, tp {m['tp_size']}), "
            f"fitted on {m['steps']} steps of {len(m['runs'])} runs: {'; '.join(m['runs'])}"
        )
        lines += _wrapped(
            "per path, the ms one unit of each column costs: a step's device time (or a host "
            "stage's) is the sum over its row of cost x the step's count of that unit"
        )
        used = set()
        for path in self.device:
            lines.append(f"{path}: {_PATH_MEANS[path]}")
            rows = {"device": self.device[path]}
            rows |= {f"host {s}": self.host[path][s] for s in HOST_STAGES}
            lines += _cost_table(rows)
            used |= {n for f in rows.values() for n in f.features}
            if self.shapes.get(path):
                factors = ", ".join(f"{k}: {v:.3f}" for k, v in self.shapes[path].items())
                lines.append(f"  device, per captured shape (real / fit): {factors}")
            if self.ranges.get(path):
                spans = ", ".join(
                    f"{name} {lo:.4g}-{hi:.4g} ({UNITS[name]})"
                    for name, (lo, hi) in self.ranges[path].items()
                )
                lines += _wrapped(f"  calibrated, {path}: {spans}")
        lines.append(f"host between two steps (the loop around them): {self.between_ms:.4g} ms")
        lines += _legend(used)
        if self.errors:
            lines.append("its error on the steps it was fitted on (|fit - real| / real):")
        for e in self.errors:
            lines.append(
                f"  {e['phase']:>7}: {e['steps']} steps, device median "
                f"{e['device_error_pct']:.1f}% (p90 {e['device_error_p90_pct']:.1f}%), host "
                f"median {e['host_error_pct']:.1f}%"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    # -- saved and loaded -----------------------------------------------------------------
    def to_dict(self) -> dict:
        def linear(f: Linear) -> dict:
            return dict(zip(f.features, f.coef))

        return {
            "version": VERSION,
            "meta": self.meta,
            "device": {p: linear(f) for p, f in self.device.items()},
            "host": {p: {s: linear(f) for s, f in st.items()} for p, st in self.host.items()},
            "between_ms": self.between_ms,
            "errors": self.errors,
            "shapes": self.shapes,
            "ranges": {p: {n: list(r) for n, r in d.items()} for p, d in self.ranges.items()},
            "shape_steps": self.shape_steps,
        }

    @classmethod
    def from_dict(cls, data: dict) -> StepCosts:
        if data.get("version") != VERSION:
            raise ValueError(f"step costs of version {data.get('version')}; this reads {VERSION}")

        def linear(d: dict) -> Linear:
            return Linear(tuple(d), tuple(float(v) for v in d.values()))

        return cls(
            meta=data["meta"],
            device={p: linear(d) for p, d in data["device"].items()},
            host={p: {s: linear(d) for s, d in st.items()} for p, st in data["host"].items()},
            between_ms=float(data["between_ms"]),
            errors=list(data["errors"]),
            # (older: none of these three)
            shapes={p: dict(d) for p, d in data.get("shapes", {}).items()},
            ranges={
                p: {n: (float(r[0]), float(r[1])) for n, r in d.items()}
                for p, d in data.get("ranges", {}).items()
            },
            shape_steps={p: dict(d) for p, d in data.get("shape_steps", {}).items()},
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path


def load_step_costs(path: str | Path) -> StepCosts:
    """Step costs saved with `StepCosts.save`."""
    return StepCosts.from_dict(json.loads(Path(path).read_text()))


def fit_step_costs(runs) -> StepCosts:
    """Fit step costs on recorded runs of one model on one device: a history (live, or loaded
    with `load_run`), a list of them, or a mapping name -> history. Runs of another model,
    device, dtype or tensor-parallel size are refused."""
    named = named_runs(runs)
    setup = check_same_setup(named, SETUP)
    steps = steps_of(named)
    if len(steps) < 8:
        raise ValueError(f"step costs need at least 8 recorded steps, the runs have {len(steps)}")
    features = step_features(steps)
    device, host, shapes, ranges, shape_steps = {}, {}, {}, {}, {}
    for path in PATHS:
        rows = (features.path == path).to_numpy()
        if rows.sum() < len(DEVICE_FEATURES[path]):
            continue
        f = features[rows]
        device[path], host[path] = _fit_path(f, steps[rows], path)
        names = [n for n in DEVICE_FEATURES[path] if n not in _CONSTANT]
        ranges[path] = {n: (float(f[n].min()), float(f[n].max())) for n in names}
        if path != "eager":
            shapes[path] = _shape_factors(f, steps[rows], path, device[path])
            keys = shape_keys(path, f.rows.to_numpy(), f.tokens.to_numpy())
            shape_steps[path] = {k: int(n) for k, n in zip(*np.unique(keys, return_counts=True))}
    first = next(iter(named.values())).meta
    meta = {
        **setup,
        "num_pages": first.get("num_pages"),
        "page_size": first.get("page_size"),
        "max_running_reqs": first.get("max_running_reqs"),
        "cuda_graph": bool(first.get("cuda_graph", False)),
        "cuda_graph_max_bs": first.get("cuda_graph_max_bs", 256),
        # (runs recorded before prefill graphs: none)
        "cuda_graph_max_tokens": first.get("cuda_graph_max_tokens", 0),
        "runs": list(named),
        "steps": int(len(steps)),
    }
    costs = StepCosts(
        meta, device, host, _between_ms(named), shapes=shapes, ranges=ranges,
        shape_steps=shape_steps,
    )  # fmt: skip
    return replace(costs, errors=_errors(costs, steps))


def _fit_path(features, steps, path: str) -> tuple[Linear, dict[str, Linear]]:
    """The device time and each host stage's time (absolute errors) of one path's steps.

    A step's device time is the longer of the device's work and the host's enqueueing of it
    (its forward and sample stages: the timer runs from the first kernel's launch to the
    last's end, and an eager forward of small batches launches its kernels slower than the
    device runs them). The device's work is fitted on relative errors (a decode step of 2 ms
    counts as much as a prefill of 200), on the steps whose device time is well beyond their
    enqueueing (the others show the host's time, not the device's), or all when too few."""
    names = DEVICE_FEATURES[path]
    a = features[list(names)].to_numpy()
    y = steps.device_ms.to_numpy(dtype=float)
    enqueue = (steps.host_forward_ms + steps.host_sample_ms).to_numpy(dtype=float)
    bound = y > 1.2 * np.nan_to_num(enqueue)
    if bound.sum() < 4 * len(names):
        bound[:] = True
    coef, _ = robust_nnls(a[bound], y[bound], 1.0 / np.maximum(y[bound], 1e-3))
    device = Linear(names, tuple(float(c) for c in coef))
    host = {}
    for stage in HOST_STAGES:
        names = HOST_FEATURES[stage]
        y = steps[f"host_{stage}_ms"].to_numpy(dtype=float)
        coef, _ = robust_nnls(features[list(names)].to_numpy(), np.nan_to_num(y))
        host[stage] = Linear(names, tuple(float(c) for c in coef))
    return device, host


def _shape_factors(features, steps, path: str, fit: Linear) -> dict[str, float]:
    """Per captured shape replayed at least `MIN_SHAPE_STEPS` times: the median ratio of its
    steps' device time to the fit's, in the order of the shapes' sizes."""
    fitted = fit({c: features[c].to_numpy() for c in fit.features})
    ratio = steps.device_ms.to_numpy(dtype=float) / np.maximum(fitted, 1e-9)
    keys = np.array(shape_keys(path, features.rows.to_numpy(), features.tokens.to_numpy()))
    out = {}
    for key in sorted(set(keys.tolist()), key=lambda k: [int(n) for n in k.split("x")]):
        chosen = keys == key
        if chosen.sum() >= MIN_SHAPE_STEPS:
            out[key] = round(float(np.median(ratio[chosen])), 4)
    return out


def _between_ms(named: dict) -> float:
    """The median host time from the end of one scheduler step (its record built) to the
    launch of the next, over steps after which work was left (not an engine idle until the
    next arrival)."""
    gaps = []
    for history in named.values():
        s = history.steps.sort_values("launched_at")
        ended = (s.completed_at + s.host_record_ms.fillna(0) / 1e3).to_numpy()
        launches = s.launched_at.to_numpy()
        following = np.searchsorted(launches, ended, side="left")
        busy = ((s.running > 0) | (s.queue_len > 0)).to_numpy() & (following < len(s))
        at = following[busy]
        gaps.extend(((launches[at] - ended[busy]) * 1e3).tolist())
    return float(max(np.median(gaps), 0.0)) if gaps else 0.0


def _errors(costs: StepCosts, steps) -> list[dict]:
    """Per phase: the steps' relative errors against the costs fitted on them."""
    device, host = costs.predict_steps(steps)
    real_device = steps.device_ms.to_numpy(dtype=float)
    real_host = steps.host_ms.to_numpy(dtype=float)
    out = []
    for phase in ("prefill", "mixed", "decode"):
        rows = (steps.phase == phase).to_numpy()
        if not rows.any():
            continue
        d = np.abs(device[rows] - real_device[rows]) / np.maximum(real_device[rows], 1e-9)
        h = np.abs(host[rows] - real_host[rows]) / np.maximum(real_host[rows], 1e-9)
        out.append(
            {
                "phase": phase,
                "steps": int(rows.sum()),
                "device_error_pct": round(float(np.median(d)) * 100, 2),
                "device_error_p90_pct": round(float(np.quantile(d, 0.9)) * 100, 2),
                "host_error_pct": round(float(np.median(h)) * 100, 2),
            }
        )
    return out


# -- how the costs print -------------------------------------------------------------------
# each feature's column in the printed costs: the unit one cost is per (`features.UNITS`), short
_COLUMNS = {
    "1": "step",
    "prompt": "prompt step",
    "decode": "decode step",
    "rows": "request",
    "prefill_rows": "prompt req",
    "sampled": "sampled",
    "tokens": "1k tokens",
    "tokens_over": f"1k tok>{KNEE}",
    "prefill_pairs": "1M pairs",
    "decode_context": "1k KV read",
}
# what each column counts, said once under the tables (those of "step" need no words)
_COLUMN_MEANS = {
    "prompt": "prompt step = prefill or mixed",
    "decode": "decode step = decode only",
    "rows": "request = as run (a graph's padding too)",
    "prefill_rows": "prompt req = computing prompt tokens",
    "sampled": "sampled = given a token",
    "tokens": "1k tokens = computed (padding too)",
    "tokens_over": f"1k tok>{KNEE} = beyond the step's first {KNEE}",
    "prefill_pairs": "1M pairs = causal (query, key) pairs of prompt tokens",
    "decode_context": "1k KV read = KV tokens the decoding requests' attention read",
}
_PATH_MEANS = {
    "graph": "a decode step replayed as a CUDA graph",
    "prompt_graph": "a prefill or mixed step replayed as a CUDA graph (padded to its shape)",
    "eager": "a step whose layers are launched one by one",
}
_STAGE_MEANS = (
    "host stages: schedule = pick the batch, admit; prepare = KV pages, inputs; plan = attention "
    "metadata; forward, sample = launch them (the device's time is at least theirs); share = "
    "prompt pages to the prefix cache; collect = tokens to their requests; record = the record"
)


def _cost_table(rows: Mapping[str, Linear]) -> list[str]:
    """Rows of costs as a table: a column per feature any of them has (blank where a row has
    no such term, 0 where the fit found it costs nothing), headed by its unit."""
    names = [n for n in _COLUMNS if any(n in f.features for f in rows.values())]
    cells = {
        label: [f"{dict(zip(f.features, f.coef))[n]:.4g}" if n in f.features else "" for n in names]
        for label, f in rows.items()
    }
    widths = [
        max(len(_COLUMNS[n]), *(len(c[i]) for c in cells.values())) for i, n in enumerate(names)
    ]
    label_width = max(len("ms per"), *(len(label) for label in rows))
    head = "  ".join(f"{_COLUMNS[n]:>{w}}" for n, w in zip(names, widths))
    lines = [f"  {'ms per':<{label_width}}  {head}"]
    for label, row in cells.items():
        cells_text = "  ".join(f"{c:>{w}}" for c, w in zip(row, widths))
        lines.append(f"  {label:<{label_width}}  {cells_text}".rstrip())
    return lines


def _legend(used: set[str]) -> list[str]:
    """What the tables' columns and rows count, wrapped."""
    said = "; ".join(_COLUMN_MEANS[n] for n in _COLUMNS if n in used and n in _COLUMN_MEANS)
    return _wrapped(f"columns: {said}" if said else "") + _wrapped(_STAGE_MEANS)


def _wrapped(text: str) -> list[str]:
    """A line of the printed costs, wrapped at 100 characters (its indent kept, and two more on
    the lines it continues on)."""
    import textwrap

    indent = " " * (len(text) - len(text.lstrip()))
    return textwrap.wrap(text, 100, subsequent_indent=indent + "  ") if text else []

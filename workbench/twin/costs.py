"""Step costs: what one step of a model costs on a device, fitted from recorded runs.

Per path (`features.PATHS`), the device time and each host stage's time are sums of non-negative
costs per feature (`features.py`), plus the host's time between two steps. Each captured graph
shape runs kernels chosen for its size, so a shape replayed often enough also keeps its own factor
on the fit (`StepCosts.shapes`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from operator import mul
from pathlib import Path
from typing import Any

import numpy as np

from ..clocks import HOST_STAGES
from ..models import ModelConfig, resolve
from .coverage import MIN_SHAPE_STEPS, uncalibrated
from .features import (
    HOST_FEATURES,
    KNEE,
    PATHS,
    UNITS,
    device_features,
    is_moe,
    shape_keys,
    step_features,
)
from .fit import robust_nnls
from .routing import fit_prompt_spread
from .runs import check_same_setup, named_runs, shared_kernels, steps_of

VERSION = 1
_NO_KERNELS = "kernels of its runs: not recorded (runs saved before 2026-12-06 do not say them)"
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
        # (the sum of coef x feature, in the features' order, without a Python call per term)
        return sum(map(mul, self.coef, map(f.__getitem__, self.features)))


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
    # an MoE model's: how its prompt chunks route (`routing.fit_prompt_spread`): "prompt_spread",
    # the prompt "steps" it was fitted on and the median "error_pct" of their experts touched
    routing: dict[str, float] = field(default_factory=dict)

    @property
    def prompt_spread(self) -> float:
        """A prompt chunk of n tokens routes as n ** this independent tokens (`routing.py`)."""
        return float(self.routing.get("prompt_spread", 1.0))

    def predict(self, f: Mapping[str, float]) -> tuple[float, tuple[float, ...]]:
        """A step's device ms and host ms per stage from its `features.batch_features`."""
        # NOTE: in plain floats: numpy's overhead per call would cost more than the arithmetic
        return self._times(f["path"], f, max)

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

    def _times(self, path: str, f, maximum=np.maximum) -> tuple:
        # NOTE: a step's device time is never shorter than the host's enqueueing of it
        fit = self._fit_for(path)
        host = tuple([self.host[fit][s](f) for s in HOST_STAGES])
        device = self.device[fit](f) * self._shape_factor(path, f)
        return maximum(device, host[_FORWARD] + host[_SAMPLE]), host

    def _fit_for(self, path: str) -> str:
        """The path whose fit a step of `path` takes (its own, else the one standing in)."""
        if path in self.device:
            return path
        return next((p for p in _STANDS_IN[path] if p in self.device), next(iter(self.device)))

    def _shape_factor(self, path: str, f):
        factors = self.shapes.get(path)
        if not factors:
            return 1.0
        keys = shape_keys(path, f["rows"], f["tokens"])
        if isinstance(keys, str):
            return shape_factor(path, factors, keys)
        return np.array([shape_factor(path, factors, k) for k in keys])

    def uncalibrated(self, steps) -> np.ndarray:
        """Per step of a steps table: what calibration did not cover, "" where it did."""
        if not hasattr(steps, "columns"):
            raise TypeError(
                f"steps: a steps table (a run's `steps`, a DataFrame), got {type(steps).__name__}"
            )
        return uncalibrated(steps, self.device, self.ranges, self.shape_steps)

    def summary(self) -> str:
        """What the costs say: per path, the ms one unit of each feature costs."""
        m = self.meta
        runs = len(m["runs"])
        lines = _wrapped(
            f"step costs of {m['model']} on {m['device_name']} ({m['dtype']}, tp {m['tp_size']}), "
            f"fitted on {m['steps']} steps of {runs} run{'s' * (runs != 1)}: {'; '.join(m['runs'])}"
        )
        kernels = m.get("kernels")
        said = ", ".join(f"{k} {v}" for k, v in (kernels or {}).items() if v is not None)
        lines += _wrapped(f"kernels of its runs: {said}" if kernels else _NO_KERNELS)
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
        if self.routing:
            r = self.routing
            lines += _wrapped(
                f"routing: a prompt chunk of n tokens touches as many experts as n ** "
                f"{r['prompt_spread']:.2f} tokens routed independently (fitted on {r['steps']} "
                f"prompt steps, experts touched median error {r['error_pct']:.1f}%)"
            )
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
            "routing": self.routing,
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
            shapes={p: dict(d) for p, d in data.get("shapes", {}).items()},
            ranges={
                p: {n: (float(r[0]), float(r[1])) for n, r in d.items()}
                for p, d in data.get("ranges", {}).items()
            },
            shape_steps={p: dict(d) for p, d in data.get("shape_steps", {}).items()},
            routing=dict(data.get("routing", {})),
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path


def shape_factor(path: str, factors: Mapping[str, float], key: str) -> float:
    """The device-time factor of captured shape `key` among a path's `factors`: its own; for a
    decode graph without one, the nearest size's in powers of two; else 1."""
    if key in factors:
        return factors[key]
    if path != "graph":
        return 1.0
    # NOTE: the kernels chosen for a decode size change little from one size to the next;
    # nearest by ratio (the larger over the smaller), which is nearest in powers of two
    size = int(key)
    return factors[min(factors, key=lambda k: max(int(k), size) / min(int(k), size))]


def load_step_costs(path: str | Path) -> StepCosts:
    """Step costs saved with `StepCosts.save`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no step costs file {str(path)!r} (StepCosts.save writes one)")
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not step costs (StepCosts.save's JSON): {exc}") from None
    return StepCosts.from_dict(doc)


def fit_step_costs(runs) -> StepCosts:
    """Fit step costs on recorded runs of one model, device, dtype and tensor-parallel size: a
    history (live, or from `load_run`), a list of them, or a mapping name -> history."""
    named = named_runs(runs)
    setup = check_same_setup(named, SETUP)
    steps = steps_of(named)
    if len(steps) < 8:
        raise ValueError(f"step costs need at least 8 recorded steps, the runs have {len(steps)}")
    features = step_features(steps)
    moe = is_moe(steps)
    device, host, shapes, ranges, shape_steps = {}, {}, {}, {}, {}
    for path in PATHS:
        rows = (features.path == path).to_numpy()
        if rows.sum() < len(device_features(path, moe)):
            continue
        f = features[rows]
        device[path], host[path] = _fit_path(f, steps[rows], device_features(path, moe))
        names = [n for n in device_features(path, moe) if n not in _CONSTANT]
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
        "cuda_graph_max_tokens": first.get("cuda_graph_max_tokens", 0),
        "kernels": shared_kernels(named),
        "runs": list(named),
        "steps": int(len(steps)),
    }
    between = _between_ms(named)
    routing = _routing_fit(steps, setup["model"]) if moe else {}
    costs = StepCosts(
        meta,
        device,
        host,
        between,
        shapes=shapes,
        ranges=ranges,
        shape_steps=shape_steps,
        routing=routing,
    )
    return replace(costs, errors=_errors(costs, steps))


def _routing_fit(steps, model: str) -> dict[str, float]:
    """How an MoE model's prompt chunks route (`routing.fit_prompt_spread`); empty (every token
    independent) where the model's configuration cannot be found here."""
    try:
        cfg = ModelConfig.from_dir(resolve(model))
    except (OSError, ValueError):
        return {}
    spread, n, error = fit_prompt_spread(steps, cfg.num_experts, cfg.num_experts_per_tok)
    return {"prompt_spread": spread, "steps": n, "error_pct": round(error, 2)}


def _fit_path(features, steps, names: tuple[str, ...]) -> tuple[Linear, dict[str, Linear]]:
    a = features[list(names)].to_numpy()
    y = steps.device_ms.to_numpy(dtype=float)
    enqueue = (steps.host_forward_ms + steps.host_sample_ms).to_numpy(dtype=float)
    # NOTE: fitted on relative errors, on the steps whose timer shows the device's work rather
    # than the host's enqueueing of it
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
    """Per shape replayed often enough: the median of its steps' real device time / the fit's."""
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
    """The median host time from one step's record to the next's launch, the engine busy."""
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
    "experts": "experts",
}
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
    "experts": "experts = an MoE model's experts touched per MoE layer (mean over them)",
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
    # NOTE: blank where a row has no such term, 0 where the fit found it costs nothing
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
    said = "; ".join(_COLUMN_MEANS[n] for n in _COLUMNS if n in used and n in _COLUMN_MEANS)
    return _wrapped(f"columns: {said}" if said else "") + _wrapped(_STAGE_MEANS)


def _wrapped(text: str) -> list[str]:
    import textwrap

    indent = " " * (len(text) - len(text.lstrip()))
    return textwrap.wrap(text, 100, subsequent_indent=indent + "  ") if text else []

"""A twin for `LLM(model, step_costs=costs, ...)`: its settings checked against what the costs
were recorded on, then its engine and probe on one timeline."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..config import KERNEL_OPTIONS, EngineConfig, default_page_size
from ..core import SamplingParams
from ..history.roofline import Roofline, spec_named
from .costs import StepCosts
from .engine import TwinEngine
from .probe import TwinClock, TwinProbe
from .timeline import Timeline


def twin_settings(costs: StepCosts, model: str, options: dict[str, Any]) -> dict[str, Any]:
    """`LLM`'s keywords for a twin of `costs` (`device`, `dtype`, `overlap`, `tp_size` filled in
    from the recording); a ValueError for a model or setting the costs cannot stand for."""
    if not isinstance(costs, StepCosts):
        raise TypeError(
            f"step_costs must be StepCosts (fit_step_costs, load_step_costs), got {costs!r}"
        )
    meta = costs.meta
    if str(model) != str(meta["model"]):
        raise ValueError(
            f"step_costs were fitted on runs of {meta['model']!r}, not {model!r}: fit them on "
            f"runs of {model!r}, or give model={meta['model']!r}"
        )
    if options.get("device") not in (None, "cpu"):
        raise ValueError(
            f"device={options['device']!r}: a twin runs on the CPU and stands for the recorded "
            f"{meta['device_name']}; leave device out"
        )
    for name in ("dtype", "tp_size"):
        given, recorded = options.get(name), meta[name]
        if given is not None and str(given).removeprefix("torch.") != str(recorded):
            raise ValueError(
                f"{name}={given!r}: the step costs were recorded with {name}={recorded!r}, "
                "the only one they can predict"
            )
    _check_no_kernels(options, meta.get("kernels"))
    recorded_type = "cuda" if str(meta["device"]).startswith("cuda") else "cpu"
    overlap, page_size = options.get("overlap"), options.get("page_size")
    if page_size is None:
        page_size = meta.get("page_size") or default_page_size(recorded_type)
    graphs = {
        name: meta[name]
        for name in ("cuda_graph_max_bs", "cuda_graph_max_tokens")
        if options.get(name) is None and meta.get(name) is not None
    }
    return {
        **options,
        **graphs,
        "device": "cpu",
        "page_size": page_size,
        "dtype": meta["dtype"],
        "overlap": recorded_type == "cuda" if overlap is None else overlap,
    }


def _check_no_kernels(options: dict[str, Any], recorded: dict | None) -> None:
    """A twin runs no kernels: its costs stand for those its runs ran. A kernel option is taken
    where it asks for nothing (its default) or for what the runs ran, else refused by name."""
    defaults = {f.name: f.default for f in fields(EngineConfig)}
    for name in KERNEL_OPTIONS:
        if name not in options or options[name] == defaults[name]:
            continue
        ran = _recorded_kernel(recorded, name)
        if recorded is not None and options[name] == ran:
            continue
        said = f"they ran {name}={ran!r}" if recorded else "they do not say which kernels"
        raise ValueError(
            f"{name}={options[name]!r}: a twin runs no kernels, its step costs predict the "
            f"kernels of the runs they were fitted on ({said}); leave {name} out, or fit "
            "step costs on runs recorded with it"
        )


def _recorded_kernel(recorded: dict | None, name: str) -> Any:
    """The value of the kernel option `name` that a run's `kernels` (`Engine.kernels`) stand
    for: decode_kernel is its decode attention, decode_tensor_cores its decode cores (None where
    they change with the batch size)."""
    recorded = recorded or {}
    if name == "decode_kernel":
        return recorded.get("decode_attention")
    if name == "decode_tensor_cores":
        return {"tensor cores": True, "CUDA cores": False}.get(recorded.get("decode_cores"))
    return recorded.get(name)


# What a request may ask that a twin cannot stand for: its steps' costs were fitted on runs
# without it (penalties and a bias move sampling out of the decode graph; prompt log
# probabilities compute the logits of every prompt token), and it has no logits to give.
_UNTIMED = {
    "logprobs": None,
    "prompt_logprobs": None,
    "logit_bias": None,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}


def check_twin_request(sampling: SamplingParams, index: int = 0) -> None:
    """A ValueError, naming the parameter, for a request whose cost a twin does not model."""
    for name, plain in _UNTIMED.items():
        value = getattr(sampling, name)
        if value != plain:
            raise ValueError(
                f"{name}={value!r} (prompt {index}): a twin (step_costs) predicts the steps of "
                f"requests without it (its costs were fitted on such runs, and it computes no "
                f"logits); leave {name} at {plain!r} to time this request"
            )


def twin_meta(costs: StepCosts, engine: TwinEngine) -> dict[str, Any]:
    """What a twin's run says of itself beside its settings."""
    recorded = costs.meta
    return {
        "simulated": True,
        "device": recorded["device"],
        "device_name": recorded["device_name"],
        "tp_size": recorded["tp_size"],
        "cuda_graph": bool(engine.captures_graphs),
        "step_costs": costs.to_dict(),
    }


def build_twin(config: EngineConfig, costs: StepCosts, record: str, profile_steps):
    """The twin's engine, probe and clock, on one timeline."""
    timeline = Timeline()
    engine = TwinEngine(config, costs, timeline)
    probe = TwinProbe(timeline, costs, record, profile_steps=profile_steps)
    spec = spec_named(str(costs.meta["device_name"]))
    probe.roofline = Roofline.for_model(
        engine.model_config, engine.dtype.itemsize, spec and spec.times(engine.num_devices)
    )
    return engine, probe, TwinClock(timeline)

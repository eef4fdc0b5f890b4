"""Kernel families: profiler event names sorted into families, and each step's time by family."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..timing import add_timing_columns, device_on_host

if TYPE_CHECKING:
    import pandas as pd

_FAMILIES = [
    # NOTE: first: NCCL's kernel names also mention the reduction ("AllReduce_Sum_bf16")
    ("communication", re.compile(r"nccl|all_?reduce|all_?gather|gloo|c10d::", re.I)),
    # an MoE layer's one-launch routing at small batches (`kernels/moe_route.py`)
    ("router", re.compile(r"moe_route", re.I)),
    # the fused MoE kernels (`kernels/fused_moe.py`; before "act": one's name holds "silu")
    ("experts", re.compile(r"moe_gate_up_silu|moe_down_weighted|fused_moe", re.I)),
    # NOTE: FlashInfer's attention kernels by name: its namespace also holds its norm, SiLU-and-mul,
    # RoPE and sampling kernels ("flashinfer::norm::FusedAddRMSNormKernel" is no attention)
    (
        "attention",
        re.compile(
            r"attention|With(Paged|Ragged)?KVCache|MergeState|PODWith|xqa|flash_fwd|"
            r"flash_attn|flash::|sdpa|fmha",
            re.I,
        ),
    ),
    (
        "sampling",
        re.compile(r"softmax|argmax|exponential|sampling|multinomial|topk|sort|uniform|rand", re.I),
    ),
    (
        "matmul",
        re.compile(r"gemm|nvjet|cutlass|\bmm\b|aten::mm|addmm|bmm|matmul|linear|sm90_xmma", re.I),
    ),
    ("norm/rope/act", re.compile(r"norm|rsqrt|rope|rotary|silu|act_and_mul|pow|mean", re.I)),
]
# on a CPU, time is counted on these leaf operators (with their callers it would count twice)
_CPU_LEAVES = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_attention_math",
    "aten::_softmax",
    "aten::argmax",
    "aten::exponential_",
    "aten::uniform_",
    "aten::log",
    "aten::log_",
    "aten::div",
    "aten::mul",
    "aten::add",
    "aten::silu",
    "aten::pow",
    "aten::mean",
    "aten::rsqrt",
    "aten::index",
    "aten::index_copy_",
    "aten::cat",
    "aten::copy_",
    "aten::embedding",
    "aten::index_select",
    "aten::neg",
    "aten::neg_",
    "aten::sub",
    "aten::sub_",
    "c10d::allreduce_",
    "c10d::_allgather_base_",
    "c10d::allgather_into_tensor_coalesced_",
}


def family(name: str, category: str) -> str:
    """An event's family: "hook" for a hook range, else the first pattern its name matches."""
    if category == "hook":
        return "hook"
    for fam, pattern in _FAMILIES:
        if pattern.search(name):
            return fam
    return "other"


def leaf_events(events: pd.DataFrame) -> pd.DataFrame:
    """The events that time is counted on: kernels, or on a CPU its leaf operators; with their
    `exclusive_us` (`exclusive_us`), the time they count."""
    if (events.category == "kernel").any():
        leaf = events[events.category == "kernel"]
    else:
        leaf = events[events.name.isin(_CPU_LEAVES)]
    return leaf.assign(exclusive_us=exclusive_us(leaf))


def exclusive_us(events: pd.DataFrame) -> pd.Series:
    """Each event's time as the last of a step's events to have started: from its start, or from
    the end of those before it where it started while they ran, to its end (none if it ends
    inside them). A kernel launched with programmatic dependent launch (`pdl`) starts before the
    one it follows ends, and waits inside for it: its duration holds that wait, and a step's
    durations add up to more than its span, where these add up to the time some kernel ran.
    Events that do not overlap keep their durations."""
    import numpy as np

    keys = ["step", "rank"] if "rank" in events else ["step"]
    ordered = events.sort_values([*keys, "start_us"])
    start, duration = ordered.start_us.astype(float), ordered.duration_us.astype(float)
    groups = [ordered[k] for k in keys]
    end = (start + duration).groupby(groups)
    before = end.cummax().groupby(groups).shift().fillna(-np.inf)
    waited = (before - start).clip(lower=0)
    return (duration - waited).clip(lower=0).reindex(events.index)


def breakdown_table(history) -> pd.DataFrame:
    """ms per (step, family) of the profiled steps, "between kernels" and "idle" included, so a
    step's rows add up to its span; a kernel counts its `exclusive_us`."""
    import pandas as pd

    events = history.events
    if events.empty:
        return pd.DataFrame(columns=["step", "family", "ms"])
    leaf = leaf_events(events)
    names = leaf.groupby(["step", "name", "category"], as_index=False).exclusive_us.sum()
    names["family"] = [family(n, c) for n, c in zip(names.name, names.category)]
    busy = names.groupby(["step", "family"], as_index=False).exclusive_us.sum()
    busy["ms"] = busy.exclusive_us / 1e3
    steps = history.steps
    if "idle_ms" not in steps:
        steps = add_timing_columns(steps.copy(), device_on_host(history))
    steps = steps.set_index("step").reindex(events.step.unique())
    total = busy.groupby("step").ms.sum().reindex(steps.index, fill_value=0.0)
    rest = {
        "between kernels": (steps.device_ms - total).clip(lower=0),
        "idle": steps.idle_ms,
    }
    rows = [
        pd.DataFrame({"step": ms.index, "family": name, "ms": ms.to_numpy()})
        for name, ms in rest.items()
    ]
    return pd.concat([busy[["step", "family", "ms"]], *rows], ignore_index=True)

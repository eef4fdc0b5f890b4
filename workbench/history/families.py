"""Kernel families: profiler event names sorted into communication (tensor parallelism's
collectives), attention, matmul, sampling, norm/rope/act and other, and each step's device time
by family (record="full")."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

_FAMILIES = [
    # NOTE: first: NCCL's kernel names also mention the reduction ("AllReduce_Sum_bf16")
    ("communication", re.compile(r"nccl|all_?reduce|all_?gather|gloo|c10d::", re.I)),
    ("attention", re.compile(r"attention|flash|BatchDecode|BatchPrefill|sdpa|fmha", re.I)),
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
# On a CPU there are no kernels: time is counted on these leaf operators (counting the operators
# that call them as well would count it twice).
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
    """The family of one profiler event: "hook" for a hook range, else the first family whose
    pattern its name matches, else "other"."""
    if category == "hook":
        return "hook"
    for fam, pattern in _FAMILIES:
        if pattern.search(name):
            return fam
    return "other"


def breakdown_table(history) -> pd.DataFrame:
    """ms per (step, family): kernels on a GPU, leaf operators on a CPU; `idle` fills up to the
    step's wall time."""
    import pandas as pd

    events = history.events
    if events.empty:
        return pd.DataFrame(columns=["step", "family", "ms"])
    on_gpu = (events.category == "kernel").any()
    leaf = events[events.category == "kernel"] if on_gpu else events[events.name.isin(_CPU_LEAVES)]
    # each name classified once per step, not once per event (tens of thousands in a run)
    names = leaf.groupby(["step", "name", "category"], as_index=False).duration_us.sum()
    names["family"] = [family(n, c) for n, c in zip(names.name, names.category)]
    busy = names.groupby(["step", "family"], as_index=False).duration_us.sum()
    busy["ms"] = busy.duration_us / 1e3
    wall = history.steps.set_index("step").wall_ms
    total = busy.groupby("step").ms.sum()
    idle = (wall.reindex(total.index) - total).clip(lower=0)
    idle_rows = pd.DataFrame({"step": idle.index, "family": "idle", "ms": idle.values})
    return pd.concat([busy[["step", "family", "ms"]], idle_rows], ignore_index=True)

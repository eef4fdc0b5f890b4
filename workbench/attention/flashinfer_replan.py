"""FlashInfer's schedulers (prefill and CUDA-core decode) called directly for wrappers captured in
CUDA graphs: their plan layout is fixed by the captured batch, only the work split changes
(FlashInfer 0.7.2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_ATTRIBUTES = (
    "_cached_module",
    "_plan_info",
    "_float_workspace_buffer",
    "_int_workspace_buffer",
    "_pin_memory_int_workspace_buffer",
)


class Replan:
    def __init__(
        self,
        wrapper: Any,
        heads: tuple[int, int, int, int],
        rows: int,
        total_rows: int,
        causal: bool,
        no_split: bool = False,
    ) -> None:
        """`heads`: query heads, KV heads, head size and page size, as planned; `no_split`: as
        planned with `disable_split_kv`."""
        num_heads, num_kv_heads, head_dim, page_size = heads
        self._take(wrapper, rows, total_rows)
        self.decode_qo_indptr = torch.arange(rows + 1, dtype=torch.int32)
        self.middle = (total_rows, rows, num_heads, num_kv_heads, page_size, True)
        # window_left, fixed split size, disable_split_kv, colocated CTAs, uniform q len
        self.tail = (head_dim, head_dim, causal, -1, -1, no_split, 0, 0)

    def _take(self, wrapper: Any, rows: int, total_rows: int) -> None:
        """The wrapper's planning module, workspaces and captured plan, which every plan must
        match."""
        self.module, self.expected = wrapper._cached_module, list(wrapper._plan_info)
        self.workspaces = (
            wrapper._float_workspace_buffer,
            wrapper._int_workspace_buffer,
            wrapper._pin_memory_int_workspace_buffer,
        )
        self.checks = 2
        self.rows, self.total_rows = rows, total_rows

    @classmethod
    def of(cls, wrapper: Any, *args) -> Replan | None:
        """A `Replan` of `wrapper` (planned once already); None when it is not one this knows."""
        return cls(wrapper, *args) if _known(wrapper) else None

    def __call__(
        self, indptr: np.ndarray, kv_lens: np.ndarray, qo_indptr: np.ndarray | None = None
    ) -> None:
        """Plan for these host page `indptr`, KV lengths and query `qo_indptr` (None: decode)."""
        qo = self.decode_qo_indptr if qo_indptr is None else torch.from_numpy(qo_indptr)
        info = self.module.plan(
            *self.workspaces,
            qo,
            torch.from_numpy(indptr),
            torch.from_numpy(kv_lens),
            *self.middle,
            *self.tail,
        )
        self._check(info)

    def _check(self, info) -> None:
        """The first (dummy) and the first real plan against the captured one: the layout is
        fixed after."""
        if not self.checks:
            return
        self.checks -= 1
        if list(info) != self.expected:
            raise RuntimeError(
                f"FlashInfer planned a batch of {self.rows} requests and {self.total_rows} "
                f"query tokens unlike the plan its CUDA graph was captured with ({info} "
                f"against {self.expected})"
            )


class CudaCoreReplan(Replan):
    """A `Replan` of a decode wrapper on CUDA cores: FlashInfer's decode scheduler, which splits
    the work by each request's pages alone (the KV lengths do not enter)."""

    def __init__(self, wrapper: Any, heads: tuple[int, int, int, int], rows: int, dtype) -> None:
        """`heads`: query heads, KV heads, head size and page size; `dtype`: the query's and the
        KV cache's (the module dispatches on them)."""
        num_heads, num_kv_heads, head_dim, page_size = heads
        self._take(wrapper, rows, rows)
        empty = torch.empty(0, dtype=dtype)
        # ..., CUDA graph, window_left, logits soft cap, head sizes (QK, VO), query and KV dtypes
        self.after = (rows, num_heads, num_kv_heads, page_size, True, -1, 0.0, head_dim, head_dim)
        self.after += (empty, empty)

    @classmethod
    def of(cls, wrapper: Any, *args) -> Replan | None:
        cuda_cores = getattr(wrapper, "use_tensor_cores", None) is False
        return cls(wrapper, *args) if cuda_cores and _known(wrapper) else None

    def __call__(
        self, indptr: np.ndarray, kv_lens: np.ndarray, qo_indptr: np.ndarray | None = None
    ) -> None:
        self._check(self.module.plan(*self.workspaces, torch.from_numpy(indptr), *self.after))


def _known(wrapper: Any) -> bool:
    """Whether `wrapper` plans with FlashInfer's own FA2 modules, as this file calls them."""
    return (
        getattr(wrapper, "_backend", None) == "fa2"
        and getattr(wrapper, "_jit_module", None) is None
        and all(hasattr(wrapper, name) for name in _ATTRIBUTES)
    )


def split_kv_bytes(
    rows: int, total_rows: int, num_heads: int, num_kv_heads: int, head_dim: int, sm_count: int
) -> int:
    """An upper bound of the float workspace a graph prefill plan reserves for its split KV."""
    group = num_heads // num_kv_heads
    tile = 128  # the largest query tile (rows of packed query heads)
    split_ctas = 2 * sm_count // num_kv_heads
    grid = max(split_ctas, -(-total_rows * group // tile) + rows - 1)
    partial_rows = -(-grid * tile // group)
    return num_heads * partial_rows * (head_dim + 1) * 4 + (1 << 20)  # + alignment

"""The FlashInfer backend's CUDA-graph wrappers: one per captured shape, with fixed buffers,
planned again before each replay by `Replan`. Padding requests read the dummy slot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .base import paged_lens
from .flashinfer_replan import CudaCoreReplan, Replan, split_kv_bytes

if TYPE_CHECKING:
    from ..kvcache.table import TableManager
    from .flashinfer_plan import Planner

WORKSPACE_BYTES = 256 * 2**20  # FlashInfer's float workspace, shared by the eager wrappers


@dataclass
class FlashInferMetadata:
    wrapper: Any
    out_loc: torch.Tensor


@dataclass
class TritonDecodeMetadata:
    """A decode step's inputs to `kernels/decode_attention.py`: each request's table row and
    KV length on the device (a graph's static buffers when replayed)."""

    out_loc: torch.Tensor
    rows: torch.Tensor
    kv_lens: torch.Tensor


class GraphWrappers:
    """The graph wrappers of a `FlashInferBackend`. Callers fill each graph's ``indptr``,
    ``last_page_len`` and ``qo_indptr`` buffers before a replay."""

    capturable = True

    def __init__(
        self,
        flashinfer: Any,
        planner: Planner,
        table: TableManager,
        workspace: torch.Tensor,
        tensor_cores_above: int | float,
        split_kv: bool = True,
        triton_decode: bool = False,
    ) -> None:
        """Decode shapes of more requests than `tensor_cores_above` run on tensor cores, the
        others on CUDA cores; `split_kv` False: those on tensor cores plan without FlashInfer's
        KV split; `triton_decode`: decode shapes run `kernels/decode_attention.py` (no plan)."""
        self.flashinfer, self.planner, self.table = flashinfer, planner, table
        self.workspace, self.tensor_cores_above = workspace, tensor_cores_above
        self.triton_decode = triton_decode
        self.split_kv = split_kv
        self.device, self.page_size = planner.device, planner.page_size
        self.wrappers: dict[int, Any] = {}  # decode: batch size -> wrapper
        self._decode_options: dict[int, dict] = {}  # decode: batch size -> more plan() arguments
        self._indices: torch.Tensor | None = None
        self._replans: dict[int, Replan | None] = {}
        # prefill and mixed: (tokens, rows) -> its wrapper's planner; the workspaces they share
        self._prefill_replans: dict[tuple[int, int], Replan] = {}
        self._prefill_floats: torch.Tensor | None = None
        self._prefill_ints: tuple[torch.Tensor, torch.Tensor] | None = None  # device, pinned

    def paged_lens(self, kv_lens: np.ndarray, indptr: np.ndarray, last_page_len: np.ndarray):
        paged_lens(kv_lens, self.page_size, indptr, last_page_len)

    def metadata(self, shape: Any, x: dict[str, torch.Tensor]) -> FlashInferMetadata | None:
        """The wrapper of a graph's `shape` (`engine.graph.Shape`: tokens, rows, decode) on its
        device buffers `x`; None for a prompt shape when `Replan` does not know this
        FlashInfer's planner."""
        if shape.decode and self.triton_decode:
            return TritonDecodeMetadata(x["out_loc"], x["rows"], x["kv_lens"])
        if shape.decode:
            return self.graph_metadata(shape.rows, x["out_loc"], x["kv_indptr"], x["last_page_len"])
        return self.prefill_graph_metadata((shape.tokens, shape.rows), x["out_loc"], x)

    def plan(self, shape: Any, x: dict[str, np.ndarray]) -> None:
        """Plan `shape`'s wrapper for the step whose host inputs are `x`, before it replays."""
        if shape.decode and self.triton_decode:
            return
        if shape.decode:
            self.plan_replay(shape.rows, x["kv_indptr"], x["kv_lens"])
        else:
            key = (shape.tokens, shape.rows)
            self.plan_prefill_replay(key, x["qo_indptr"], x["kv_indptr"], x["kv_lens"])

    def graph_metadata(
        self, bs: int, out_loc: torch.Tensor, indptr: torch.Tensor, last_page_len: torch.Tensor
    ) -> FlashInferMetadata:
        """A wrapper for decode batches of exactly `bs` requests, planned with dummy requests."""
        tensor_cores = bs > self.tensor_cores_above
        wrapper = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=self.indices_buffer(),
            paged_kv_last_page_len_buffer=last_page_len,
            backend="fa2",
        )
        self.wrappers[bs] = wrapper
        # NOTE: passed only when off (tensor cores only), so the default plans are the calls they
        # always were
        no_split = tensor_cores and not self.split_kv
        self._decode_options[bs] = options = {"disable_split_kv": True} if no_split else {}
        kv_lens = np.ones(bs, dtype=np.int32)
        self.planner.plan(wrapper, None, self.planner.paged(kv_lens), self._indices[:0], **options)
        heads = self.planner.heads
        if tensor_cores:
            replan = Replan.of(wrapper, heads, bs, bs, False, no_split)
        else:  # FlashInfer's decode scheduler, not the prefill one
            replan = CudaCoreReplan.of(wrapper, heads, bs, self.planner.dtype)
        self._replans[bs] = replan
        if self._replans[bs] is not None:  # it must plan what plan() planned
            indptr, last = np.empty(bs + 1, np.int32), np.empty(bs, np.int32)
            self.paged_lens(kv_lens, indptr, last)
            self.plan_replay(bs, indptr, kv_lens)
        return FlashInferMetadata(wrapper, out_loc)

    def plan_replay(self, bs: int, indptr: np.ndarray, kv_lens: np.ndarray) -> None:
        """Plan the `bs` graph wrapper for these page `indptr` and KV lengths (1 per dummy)."""
        replan = self._replans[bs]
        with self.planner.planning():
            if replan is None:
                kv = self.planner.paged(kv_lens.astype(np.int64))
                self.wrappers[bs].plan(
                    kv.indptr,
                    self._indices[:0],
                    kv.last_page_len,
                    *self.planner.heads,
                    q_data_type=self.planner.dtype,
                    kv_data_type=self.planner.dtype,
                    seq_lens=kv.seq_lens,
                    **self._decode_options[bs],
                )
            else:
                replan(indptr, kv_lens)

    def graph_indices(self, shape: Any, rows: torch.Tensor, indptr: torch.Tensor) -> None:
        """Inside a graph: the page ids of the requests in `rows`, where `indptr` places them
        (none for the Triton decode kernel, which reads the page table itself)."""
        if shape.decode and self.triton_decode:
            return
        from ..kernels.page_indices import page_indices

        buffer = self.indices_buffer()
        page_indices(self.table.page_table, rows, indptr, buffer, self.page_size)

    def indices_buffer(self) -> torch.Tensor:
        """Page ids all graph wrappers read: a row per request slot, a page per padded request."""
        if self._indices is None:
            table = self.table
            cap = (table.max_running_reqs + 1) * (table.max_seq_len + 1)
            self._indices = torch.zeros(cap, dtype=torch.int32, device=self.device)
        return self._indices

    def prefill_graph_metadata(
        self, shape: tuple[int, int], out_loc: torch.Tensor, buffers: dict[str, torch.Tensor]
    ) -> FlashInferMetadata | None:
        """A prefill wrapper for at most `tokens` query tokens of exactly `rows` requests; None
        when `Replan` does not know this FlashInfer's planner (prefill steps stay eager)."""
        tokens, rows = shape
        wrapper = self.flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._prefill_workspace(tokens, rows),
            "NHD",
            use_cuda_graph=True,
            qo_indptr_buf=buffers["qo_indptr"],
            paged_kv_indptr_buf=buffers["kv_indptr"],
            paged_kv_indices_buf=self.indices_buffer(),
            paged_kv_last_page_len_buf=buffers["last_page_len"],
            backend="fa2",
        )
        self._share_int_workspace(wrapper)
        qo, kv_lens = dummy_prefill(tokens, rows)
        kv = self.planner.paged(kv_lens)
        (qo_host,) = self.planner.staging.host([qo])
        self.planner.plan(wrapper, qo_host, kv, self.indices_buffer()[:0])
        replan = Replan.of(wrapper, self.planner.heads, rows, tokens, True)
        if replan is None:
            return None
        self._prefill_replans[shape] = replan
        self.plan_prefill_replay(shape, qo, kv.indptr_np, kv_lens)  # checks it plans the same
        return FlashInferMetadata(wrapper, out_loc)

    def plan_prefill_replay(
        self, shape: tuple[int, int], qo_indptr: np.ndarray, indptr: np.ndarray, kv_lens: np.ndarray
    ) -> None:
        with self.planner.planning():
            self._prefill_replans[shape](indptr, kv_lens, qo_indptr)

    def _prefill_workspace(self, tokens: int, rows: int) -> torch.Tensor:
        # NOTE: prefill graphs replay one at a time, so they share one float workspace
        if self._prefill_floats is None:
            sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count
            num_heads, num_kv_heads, head_dim, _ = self.planner.heads
            need = split_kv_bytes(rows, tokens, num_heads, num_kv_heads, head_dim, sm_count)
            self._prefill_floats = self.workspace
            if need > WORKSPACE_BYTES:
                self._prefill_floats = torch.zeros(need, dtype=torch.uint8, device=self.device)
        return self._prefill_floats

    def _share_int_workspace(self, wrapper: Any) -> None:
        # NOTE: prefill graphs share the first one's int workspaces: each is planned again
        # before it replays, after the last copy ran (`Planner.planning`).
        names = ("_int_workspace_buffer", "_pin_memory_int_workspace_buffer")
        if not all(hasattr(wrapper, n) for n in names):
            return
        if self._prefill_ints is None:
            self._prefill_ints = tuple(getattr(wrapper, n) for n in names)
        else:
            wrapper._int_workspace_buffer, wrapper._pin_memory_int_workspace_buffer = (
                self._prefill_ints
            )


def dummy_prefill(tokens: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """A prefill graph's capture batch (`qo_indptr`, KV lengths): each request reads itself."""
    q_lens = np.full(rows, tokens // rows, dtype=np.int64)
    q_lens[: tokens % rows] += 1
    qo = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(q_lens, out=qo[1:])
    return qo, q_lens.astype(np.int32)

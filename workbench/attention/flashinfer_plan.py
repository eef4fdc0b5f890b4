"""Planning FlashInfer wrappers from host arrays, shared by the eager and the graph wrappers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from ..device import Staging


class PagedKV(NamedTuple):
    """A batch's KV pages as FlashInfer's planner wants them, on the host (pinned)."""

    indptr: torch.Tensor
    last_page_len: torch.Tensor
    seq_lens: torch.Tensor
    indptr_np: np.ndarray


class Planner:
    """Runs the plans of every wrapper of one backend, one after another."""

    def __init__(
        self,
        staging: Staging,
        device: torch.device,
        dtype: torch.dtype,
        heads: tuple[int, int, int, int],
    ) -> None:
        """`heads`: query heads, KV heads, head size and page size."""
        self.staging, self.device, self.dtype, self.heads = staging, device, dtype, heads
        self.page_size = heads[3]
        # NOTE: plan() copies pinned host memory asynchronously; with overlap the next plan could
        # overwrite it first, so each plan waits for the previous one's copy (`planning`).
        self._plan_done: torch.cuda.Event | None = None
        self._unlaunched = False

    def paged(self, kv_lens: np.ndarray) -> PagedKV:
        ps = self.page_size
        num_pages = -(-kv_lens // ps)
        indptr = np.zeros(len(kv_lens) + 1, dtype=np.int32)
        np.cumsum(num_pages, out=indptr[1:])
        last = (kv_lens - (num_pages - 1) * ps).astype(np.int32)
        host = self.staging.host([indptr, last, kv_lens.astype(np.int32)])
        return PagedKV(*host, indptr)

    def plan(
        self,
        wrapper: Any,
        qo_indptr: torch.Tensor | None,
        kv: PagedKV,
        indices: torch.Tensor,
        **options,
    ) -> None:
        """`options`: more of the wrapper's `plan()` arguments (`disable_split_kv`)."""
        # NOTE: every host tensor handed to plan() is pinned: a pageable one would make the
        # copy wait for the GPU to finish the batch in flight, and undo overlap.
        with self.planning():
            common = dict(
                q_data_type=self.dtype, kv_data_type=self.dtype, seq_lens=kv.seq_lens, **options
            )
            if qo_indptr is None:
                wrapper.plan(kv.indptr, indices, kv.last_page_len, *self.heads, **common)
            else:
                wrapper.plan(
                    qo_indptr,
                    kv.indptr,
                    indices,
                    kv.last_page_len,
                    *self.heads,
                    causal=True,
                    **common,
                )

    @contextlib.contextmanager
    def planning(self) -> Iterator[None]:
        """Around any planning: after the previous plan's copy, before the next one's."""
        if self._unlaunched:
            torch.cuda.current_stream(self.device).synchronize()
        elif self._plan_done is not None:
            self._plan_done.synchronize()
        yield
        self._unlaunched = True

    def launched(self, timer) -> None:
        self._plan_done, self._unlaunched = timer.started, False

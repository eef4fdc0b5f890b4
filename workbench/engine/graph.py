"""CUDA graphs for decode: captured once per batch size, replayed with the batch padded by the
dummy request. Python (module hooks included) does not run during a replay; the scheduler-side
records do not depend on it. Without capture, the runner runs the same padded batches eagerly."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core import Batch

if TYPE_CHECKING:
    from ..attention.base import AttentionBackend
    from .context import ForwardContext


def capture_sizes(max_bs: int) -> list[int]:
    sizes = {1, 2, 4, 8, *range(16, max_bs + 1, 16), max_bs}
    return sorted(s for s in sizes if s <= max_bs)


class GraphRunner:
    """`model(input_ids, positions, ctx, sample_idx)` run on static buffers; padded rows write
    their K and V to `dummy_slot`, which no request reads."""

    def __init__(
        self,
        model: torch.nn.Module,
        ctx: ForwardContext,
        backend: AttentionBackend,
        dummy_slot: int,
        device: torch.device,
        max_bs: int,
        capture: bool = True,
    ) -> None:
        self.model, self.ctx, self.backend = model, ctx, backend
        self.dummy_slot = dummy_slot
        self.sizes = capture_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int32, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.out_loc = torch.full((self.max_bs,), dummy_slot, dtype=torch.int64, device=device)
        self.sample_idx = torch.arange(self.max_bs, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.metadata: dict[int, object] = {}
        self.capture = capture
        self._capture_all()

    def _args(self, bs: int) -> tuple:
        return self.input_ids[:bs], self.positions[:bs], self.ctx, self.sample_idx[:bs]

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):  # largest first, so smaller ones reuse its memory
                batch = Batch([], "decode")
                # NOTE: outside inference mode: the wrapper's buffers are updated in place by
                # every later plan(), which runs outside it.
                batch.attn_metadata = self.backend.graph_metadata(bs, self.out_loc[:bs])
                self.metadata[bs] = batch.attn_metadata
                if self.capture:
                    self._capture(bs, batch, pool, stream)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def _capture(self, bs: int, batch: Batch, pool, stream: torch.cuda.Stream) -> None:
        with self.ctx.running(batch), torch.inference_mode():
            for _ in range(2):  # warm up: no lazy initialisation inside the capture
                self.model(*self._args(bs))
            graph = torch.cuda.CUDAGraph()
            # NOTE: with tensor parallelism NCCL's watchdog thread queries events while this
            # thread captures; "thread_local" keeps its calls legal (the default mode fails them)
            mode = "thread_local" if self.model.tp.size > 1 else "global"
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=mode):
                self.logits[bs] = self.model(*self._args(bs))
        self.graphs[bs] = graph

    def can_run(self, batch: Batch) -> bool:
        return batch.phase == "decode" and batch.size <= self.max_bs

    def padded_size(self, size: int) -> int:
        return next(s for s in self.sizes if s >= size)

    def prepare(self, batch: Batch) -> None:
        """Copy the batch into the static buffers and plan the captured attention for it."""
        bs, size = self.padded_size(batch.size), batch.size
        self.input_ids[:size].copy_(batch.input_ids, non_blocking=True)
        self.positions[:size].copy_(batch.positions, non_blocking=True)
        self.out_loc[:size].copy_(batch.out_loc, non_blocking=True)
        if bs > size:
            self.input_ids[size:bs].zero_()
            self.positions[size:bs].zero_()
            self.out_loc[size:bs].fill_(self.dummy_slot)
        self.backend.prepare_replay(batch, bs)
        batch.attn_metadata = self.metadata[bs]

    def replay(self, batch: Batch) -> torch.Tensor:
        bs = self.padded_size(batch.size)
        if not self.capture:  # the same padded computation, run eagerly
            with self.ctx.running(batch), torch.inference_mode():
                return self.model(*self._args(bs))[: batch.size]
        self.graphs[bs].replay()
        return self.logits[bs][: batch.size]

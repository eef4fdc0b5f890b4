"""CUDA graphs for decode: captured once per batch size, replayed with the batch padded by the
dummy request. Python (module hooks included) does not run during a replay; the scheduler-side
records do not depend on it. Without capture, the runner runs the same padded batches eagerly."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core import Batch

if TYPE_CHECKING:
    from .engine import Engine


def capture_sizes(max_bs: int) -> list[int]:
    sizes = {1, 2, 4, 8, *range(16, max_bs + 1, 16), max_bs}
    return sorted(s for s in sizes if s <= max_bs)


class GraphRunner:
    def __init__(self, engine: Engine, max_bs: int, capture: bool = True) -> None:
        self.engine = engine
        self.sizes = capture_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        dev = engine.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int32, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.out_loc = torch.full(
            (self.max_bs,), engine.pool.dummy_slot, dtype=torch.int64, device=dev
        )
        self.sample_idx = torch.arange(self.max_bs, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.metadata: dict[int, object] = {}
        self.capture = capture
        self._capture_all()

    def _capture_all(self) -> None:
        engine = self.engine
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):  # largest first, so smaller ones reuse its memory
                batch = Batch([], "decode")
                # NOTE: outside inference mode: the wrapper's buffers are updated in place by
                # every later plan(), which runs outside it.
                batch.attn_metadata = engine.backend.graph_metadata(bs, self.out_loc[:bs])
                self.metadata[bs] = batch.attn_metadata
                args = (self.input_ids[:bs], self.positions[:bs], engine.ctx, self.sample_idx[:bs])
                if not self.capture:
                    continue
                engine.ctx.batch = batch
                with torch.inference_mode():
                    for _ in range(2):  # warm up: no lazy initialisation inside the capture
                        engine.model(*args)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self.logits[bs] = engine.model(*args)
                self.graphs[bs] = graph
                engine.ctx.batch = None
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

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
            self.out_loc[size:bs].fill_(self.engine.pool.dummy_slot)
        self.engine.backend.prepare_replay(batch, bs)
        batch.attn_metadata = self.metadata[bs]

    def replay(self, batch: Batch) -> torch.Tensor:
        bs = self.padded_size(batch.size)
        if not self.capture:  # the same padded computation, run eagerly
            ctx = self.engine.ctx
            ctx.batch = batch
            try:
                with torch.inference_mode():
                    args = (self.input_ids[:bs], self.positions[:bs], ctx, self.sample_idx[:bs])
                    return self.engine.model(*args)[: batch.size]
            finally:
                ctx.batch = None
        self.graphs[bs].replay()
        return self.logits[bs][: batch.size]

"""CUDA graphs for prefill and mixed steps, whose eager launches are host-bound (see
docs/performance.md, "Prefill and mixed steps in CUDA graphs"): captured once per (tokens, rows)
shape, replayed with the batch padded to the smallest that holds it (with the dummy request)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..core import Batch
from ..device import staging
from .graph import Layout, capture, counted_forward, send_staged
from .inputs import ranges

if TYPE_CHECKING:
    from ..attention.context import ForwardContext
    from ..attention.flashinfer_graphs import GraphWrappers
    from ..kvcache.table import TableManager

ROW_SIZES = (8, 32)  # requests per graph below the most a step can have


def token_sizes(max_tokens: int) -> list[int]:
    """Token counts captured: 16 to 512 by powers of two, then 768, 1024, 1536, ..., max_tokens."""
    sizes = [1 << k for k in range(4, 10)] + [m << k for k in range(8, 16) for m in (3, 4)]
    return sorted({*(s for s in sizes if s < max_tokens), max_tokens})


def row_sizes(tokens: int, max_rows: int) -> list[int]:
    return sorted({min(r, tokens, max_rows) for r in (*ROW_SIZES, max_rows)})


def graph_shapes(max_tokens: int, max_rows: int, max_seq_len: int) -> list[tuple[int, int]]:
    """The (tokens, rows) shapes captured: a capture's dummy request fits in one table row."""
    return [
        (t, r)
        for t in token_sizes(max_tokens)
        for r in row_sizes(t, max_rows)
        if -(-t // r) <= max_seq_len
    ]


def shape_for(shapes: list[tuple[int, int]], tokens: int, rows: int) -> tuple[int, int] | None:
    return min((s for s in shapes if s[0] >= tokens and s[1] >= rows), default=None)


def prefill_fields(tokens: int, rows: int) -> list[tuple[str, type, int]]:
    return [
        ("token_rows", np.int64, tokens),
        ("positions", np.int64, tokens),
        ("out_loc", np.int64, tokens),
        ("slots", np.int32, tokens),  # out_loc again, as the page table holds it
        ("rows", np.int64, rows),
        ("sample_idx", np.int64, rows),
        ("sample_rows", np.int64, rows),  # where the sampled tokens go: table rows ...
        ("following", np.int64, rows),  # ... and positions
        ("qo_indptr", np.int32, rows + 1),
        ("kv_indptr", np.int32, rows + 1),
        ("last_page_len", np.int32, rows),
        ("kv_lens", np.int32, rows),  # read on the host only, by the planner
        ("counted", np.int32, tokens),  # 1: a token of the batch, 0: padding (not routed)
    ]


class PrefillGraphRunner:
    """`model(input_ids, positions, ctx, sample_idx)` of prompt steps on static buffers, one graph
    per shape. A step's host work is one copy of its inputs and a plan."""

    capture: bool
    sample = False  # the engine samples from the logits

    def __init__(
        self,
        model: torch.nn.Module,
        ctx: ForwardContext,
        wrappers: GraphWrappers,
        table: TableManager,
        dummy_slot: int,
        device: torch.device,
        max_tokens: int,
        capture: bool = True,
    ) -> None:
        self.model, self.ctx, self.wrappers, self.table = model, ctx, wrappers, table
        self.dummy_slot, self.capture = dummy_slot, capture
        max_rows = table.max_running_reqs
        self.shapes = graph_shapes(max_tokens, max_rows, table.max_seq_len)
        self.layouts = {s: Layout(prefill_fields(*s)) for s in self.shapes}
        size = max(layout.nbytes for layout in self.layouts.values())
        self.staged = torch.zeros(size, dtype=torch.uint8, device=device)
        self.inputs = {s: self.layouts[s].views(self.staged) for s in self.shapes}
        self.host = {s: np.zeros(self.layouts[s].nbytes, dtype=np.uint8) for s in self.shapes}
        self.host_inputs = {s: self.layouts[s].views(self.host[s]) for s in self.shapes}
        self.ring = staging(device)
        vocab = model.model_cfg.vocab_size
        dtype = next(model.parameters()).dtype
        # NOTE: one logits buffer for all graphs: each step's sampling reads it before the next
        self.logits = torch.empty((max_rows, vocab), dtype=dtype, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.metadata: dict[tuple[int, int], object] = {}
        self._capture_all()

    def shape(self, batch: Batch) -> tuple[int, int] | None:
        if not batch.is_prefill:
            return None
        _, cached, device_len = batch.ledger
        return shape_for(self.shapes, int((device_len - cached).sum()), batch.size)

    def padded(self, shape: tuple[int, int]) -> tuple[int, int]:
        return shape[1], shape[0]

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for shape in sorted(self.shapes, reverse=True):  # largest first: the rest reuse it
                x = self._stage_dummies(shape)
                metadata = self.wrappers.prefill_graph_metadata(shape, x["out_loc"], x)
                if metadata is None:
                    raise NotImplementedError("FlashInfer's prefill planner is not one we know")
                self.metadata[shape] = metadata
                if self.capture:
                    self._capture(shape, pool, stream)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def _stage_dummies(self, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
        x = self.inputs[shape]
        for t in x.values():
            t.zero_()
        for name in ("token_rows", "rows", "sample_rows"):
            x[name].fill_(self.table.dummy_row)
        x["out_loc"].fill_(self.dummy_slot)
        x["slots"].fill_(self.dummy_slot)
        x["following"].fill_(1)
        return x

    def _capture(self, shape: tuple[int, int], pool, stream: torch.cuda.Stream) -> None:
        batch = Batch([], "prefill")
        batch.attn_metadata = self.metadata[shape]
        with self.ctx.running(batch), torch.inference_mode():
            run = functools.partial(self._run, shape)
            self.graphs[shape], _ = capture(run, pool, stream, self.model.tp.size)

    def _run(self, shape: tuple[int, int]) -> None:
        x = self.inputs[shape]
        token_rows, positions = x["token_rows"], x["positions"]
        # NOTE: the host wrote these entries in its own table only; padding writes dummy_slot
        self.table.page_table[token_rows, positions] = x["slots"]
        self.wrappers.graph_indices(x["rows"], x["kv_indptr"])
        input_ids = self.table.token_pool[token_rows, positions]
        logits = counted_forward(
            self.model, self.ctx, x["counted"], input_ids, positions, x["sample_idx"]
        )
        self.logits[: shape[1]].copy_(logits)

    def prepare(self, batch: Batch, shape: tuple[int, int], race: None = None) -> None:
        """As `GraphRunner.prepare`; the engine samples: `race` is always None."""
        x = self.host_inputs[shape]
        table_rows, cached, device_len = batch.ledger
        n, extend = batch.size, device_len - cached
        total = int(extend.sum())
        token_rows = x["token_rows"]
        token_rows[:total], token_rows[total:] = np.repeat(table_rows, extend), self.table.dummy_row
        x["positions"][:total], x["positions"][total:] = ranges(cached, device_len), 0
        slots = self.table.page_table_host[token_rows[:total], x["positions"][:total]]
        x["counted"][:total], x["counted"][total:] = 1, 0
        x["out_loc"][:total], x["out_loc"][total:] = slots, self.dummy_slot
        x["slots"][:total], x["slots"][total:] = slots, self.dummy_slot
        x["rows"][:n], x["rows"][n:] = table_rows, self.table.dummy_row
        sampled = batch.sampled_mask()
        count = int(sampled.sum())
        ends = np.cumsum(extend)
        x["sample_idx"][:count], x["sample_idx"][count:] = (ends - 1)[sampled], 0
        x["sample_rows"][:count] = table_rows[sampled]
        x["sample_rows"][count:] = self.table.dummy_row
        x["following"][:count], x["following"][count:] = device_len[sampled], 1
        qo = x["qo_indptr"]
        qo[0], qo[1 : n + 1], qo[n + 1 :] = 0, ends, total
        kv_lens = x["kv_lens"]
        kv_lens[:n], kv_lens[n:] = device_len, 1  # a padded request reads the dummy page
        self.wrappers.paged_lens(kv_lens, x["kv_indptr"], x["last_page_len"])
        send_staged(self.ring, self.host[shape], self.staged)
        batch.attn_metadata = self.metadata[shape]
        self.wrappers.plan_prefill_replay(shape, qo, x["kv_indptr"], kv_lens)

    def replay(self, batch: Batch, shape: tuple[int, int]) -> torch.Tensor:
        if not self.capture:
            with self.ctx.running(batch), torch.inference_mode():
                self._run(shape)
        else:
            self.graphs[shape].replay()
        return self.logits[: len(batch.sampled_reqs)]

    def token_targets(
        self, shape: tuple[int, int], count: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.inputs[shape]
        return x["sample_rows"][:count], x["following"][:count]

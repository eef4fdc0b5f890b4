"""CUDA graphs for prefill and mixed steps: captured once per (tokens, rows) shape, replayed with
the batch padded to the shape.

Why: an eager prefill step launches every layer's kernels from Python, and on the H200 that
host work sets the step's length: 8 to 19 ms a step whatever its tokens, where a 256-token
mixed step of Qwen3-0.6B has 2.1 ms of kernels (README, "Prefill and mixed steps are the
host's"). A replay launches them all at once.

Shapes: `token_sizes` up to `cuda_graph_max_tokens` (powers of two, then halfway steps, so a
step above 512 tokens runs at most half as many again), each with a few row counts (`row_sizes`: 8,
32 and as many as fit), so that a chunk alone and a chunk with a full decode batch both find
a graph that pads them little. A batch takes the smallest shape that holds its tokens and its
requests. Padding: the tokens past the batch's are the dummy request's (they write the pool's
dummy slot, and belong to no request's attention); the requests past it have no query tokens
and one dummy KV page. The last norm and the LM head run on one row per request (`rows`),
those past the sampled ones on row 0; the logits go to one buffer all prefill graphs share
(they replay one at a time, and each step's sampling reads them before the next replays).

Without capture (`cuda_graph=False`) the same padded steps run eagerly: the same kernels on
the same shapes, so outputs are identical either way (as for decode, `graph.py`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..core import Batch
from ..device import staging
from .graph import Layout, capture, send_staged
from .inputs import ranges

if TYPE_CHECKING:
    from ..attention.context import ForwardContext
    from ..attention.flashinfer_backend import FlashInferBackend
    from ..kvcache.table import TableManager

ROW_SIZES = (8, 32)  # requests per graph below the most a step can have


def token_sizes(max_tokens: int) -> list[int]:
    """The token counts captured: 16 to 512 by powers of two, then a power of two and three
    quarters of the next one in turn (768, 1024, 1536, 2048, ...), and `max_tokens`."""
    sizes = [1 << k for k in range(4, 10)] + [m << k for k in range(8, 16) for m in (3, 4)]
    return sorted({*(s for s in sizes if s < max_tokens), max_tokens})


def row_sizes(tokens: int, max_rows: int) -> list[int]:
    """The request counts captured with `tokens` tokens: 8, 32 and the most there can be."""
    return sorted({min(r, tokens, max_rows) for r in (*ROW_SIZES, max_rows)})


def graph_shapes(max_tokens: int, max_rows: int, max_seq_len: int) -> list[tuple[int, int]]:
    """The (tokens, rows) shapes captured, for request rows `max_seq_len` wide (a dummy request
    of the capture attends to itself only, within the dummy row)."""
    return [
        (t, r)
        for t in token_sizes(max_tokens)
        for r in row_sizes(t, max_rows)
        if -(-t // r) <= max_seq_len
    ]


def shape_for(shapes: list[tuple[int, int]], tokens: int, rows: int) -> tuple[int, int] | None:
    """The smallest shape that holds `tokens` tokens of `rows` requests (None: none does)."""
    return min((s for s in shapes if s[0] >= tokens and s[1] >= rows), default=None)


def prefill_fields(tokens: int, rows: int) -> list[tuple[str, type, int]]:
    return [
        ("token_rows", np.int64, tokens),  # each token's table row
        ("positions", np.int64, tokens),
        ("out_loc", np.int64, tokens),  # its KV slot
        ("slots", np.int32, tokens),  # out_loc again, as the page table holds it
        ("rows", np.int64, rows),  # each request's table row
        ("sample_idx", np.int64, rows),  # the token rows that get logits
        ("sample_rows", np.int64, rows),  # where the sampled tokens go: table rows ...
        ("following", np.int64, rows),  # ... and positions
        ("qo_indptr", np.int32, rows + 1),  # where each request's query tokens start
        ("kv_indptr", np.int32, rows + 1),  # where its KV pages start
        ("last_page_len", np.int32, rows),
        ("kv_lens", np.int32, rows),  # KV tokens per request (the planner's, on the host)
    ]


class PrefillGraphRunner:
    """`model(input_ids, positions, ctx, sample_idx)` of prefill and mixed batches on static
    buffers, one graph per shape (`token_sizes` x `row_sizes`). A step's host work is one
    copy of its inputs and FlashInfer's planner; the graph writes the new page-table entries,
    gathers the page ids, reads the input ids from the token pool and runs the model."""

    capture: bool
    sample = False  # the engine samples from the logits

    def __init__(
        self,
        model: torch.nn.Module,
        ctx: ForwardContext,
        backend: FlashInferBackend,
        table: TableManager,
        dummy_slot: int,
        device: torch.device,
        max_tokens: int,
        capture: bool = True,
    ) -> None:
        self.model, self.ctx, self.backend, self.table = model, ctx, backend, table
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
        self.logits = torch.empty((max_rows, vocab), dtype=dtype, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.metadata: dict[tuple[int, int], object] = {}
        self._capture_all()

    # -- shapes ---------------------------------------------------------------------------
    def shape(self, batch: Batch) -> tuple[int, int] | None:
        """The smallest captured shape that holds the batch (None: none does, or it decodes)."""
        if not batch.is_prefill:
            return None
        _, cached, device_len = batch.ledger
        return shape_for(self.shapes, int((device_len - cached).sum()), batch.size)

    def padded(self, shape: tuple[int, int]) -> tuple[int, int]:
        """Requests and tokens a batch padded to `shape` runs as."""
        return shape[1], shape[0]

    # -- capture ----------------------------------------------------------------------------
    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for shape in sorted(self.shapes, reverse=True):  # largest first: the rest reuse it
                x = self._stage_dummies(shape)
                metadata = self.backend.prefill_graph_metadata(shape, x["out_loc"], x)
                if metadata is None:  # the engine then runs prompt steps eagerly
                    raise NotImplementedError("FlashInfer's prefill planner is not one we know")
                self.metadata[shape] = metadata
                if self.capture:
                    self._capture(shape, pool, stream)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def _stage_dummies(self, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
        """The inputs of the batch the graph is captured with: every token the dummy
        request's, the rows as `dummy_prefill` spreads them (its planner fills the rest)."""
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
        """One padded step from the staged inputs (what a graph captures); its logits into
        the shared buffer."""
        x = self.inputs[shape]
        token_rows, positions = x["token_rows"], x["positions"]
        # NOTE: the host wrote these entries in its own table only (`CacheManager.allocate`);
        # padding tokens write the dummy row's first entry, which holds the dummy slot already
        self.table.page_table[token_rows, positions] = x["slots"]
        self.backend.graph_indices(x["rows"], x["kv_indptr"])
        input_ids = self.table.token_pool[token_rows, positions]
        logits = self.model(input_ids, positions, self.ctx, x["sample_idx"])
        self.logits[: shape[1]].copy_(logits)

    # -- a step -----------------------------------------------------------------------------
    def prepare(self, batch: Batch, shape: tuple[int, int], race: None = None) -> None:
        """Send the batch's inputs, padded to `shape`, to the static buffers (one copy), and
        plan the captured attention for them (the engine samples: `race` is always None)."""
        x = self.host_inputs[shape]
        table_rows, cached, device_len = batch.ledger
        n, extend = batch.size, device_len - cached
        total = int(extend.sum())
        token_rows = x["token_rows"]
        token_rows[:total], token_rows[total:] = np.repeat(table_rows, extend), self.table.dummy_row
        x["positions"][:total], x["positions"][total:] = ranges(cached, device_len), 0
        slots = self.table.page_table_host[token_rows[:total], x["positions"][:total]]
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
        self.backend.paged_lens(kv_lens, x["kv_indptr"], x["last_page_len"])
        send_staged(self.ring, self.host[shape], self.staged)
        batch.attn_metadata = self.metadata[shape]
        self.backend.plan_prefill_replay(shape, qo, x["kv_indptr"], kv_lens)

    def replay(self, batch: Batch, shape: tuple[int, int]) -> torch.Tensor:
        """The logits of the batch's sampled requests."""
        if not self.capture:  # the same padded computation, run eagerly
            with self.ctx.running(batch), torch.inference_mode():
                self._run(shape)
        else:
            self.graphs[shape].replay()
        return self.logits[: len(batch.sampled_reqs)]

    def token_targets(
        self, shape: tuple[int, int], count: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the batch's `count` sampled tokens go in the token pool: rows and positions,
        on the device already (staged with the inputs)."""
        x = self.inputs[shape]
        return x["sample_rows"][:count], x["following"][:count]

"""CUDA graphs of every step that fits one: captured once per shape, replayed with the batch padded
to the smallest shape that holds it (with the dummy request). A decode shape is a batch size (one
token a row; the graph may sample too); a prompt shape, for prefill and mixed steps, whose eager
launches are host-bound (docs/performance.md, "Prefill and mixed steps in CUDA graphs"), is a
number of tokens and of rows. Python (module hooks included) does not run during a replay.

The attention backend's `graphs` plans each shape (`GraphWrappers` for FlashInfer; the torch
backend's run eagerly, never captured: the same padded path on the CPU)."""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import numpy as np
import torch

from ..core import Batch
from ..device import Staging, staging
from ..profiling import gc_paused
from .inputs import ranges

T = TypeVar("T")

if TYPE_CHECKING:
    from ..attention.base import GraphPlans
    from ..attention.context import ForwardContext
    from ..kvcache.table import TableManager

ROW_SIZES = (8, 32)  # requests per prompt graph below the most a step can have


class Shape(NamedTuple):
    """A captured graph's inputs: `tokens` query tokens of `rows` requests."""

    tokens: int
    rows: int
    decode: bool  # one token a row, decode attention (and sampling in the graph)

    @property
    def phase(self) -> str:
        return "decode" if self.decode else "prefill"


def capture_sizes(max_bs: int) -> list[int]:
    """Decode batch sizes captured: 1, 2, 4, 8, then every 16 up to `max_bs`."""
    sizes = {1, 2, 4, 8, *range(16, max_bs + 1, 16), max_bs}
    return sorted(s for s in sizes if s <= max_bs)


def token_sizes(max_tokens: int) -> list[int]:
    """Token counts captured: 16 to 512 by powers of two, then 768, 1024, 1536, ..., max_tokens."""
    sizes = [1 << k for k in range(4, 10)] + [m << k for k in range(8, 16) for m in (3, 4)]
    return sorted({*(s for s in sizes if s < max_tokens), max_tokens})


def row_sizes(tokens: int, max_rows: int) -> list[int]:
    return sorted({min(r, tokens, max_rows) for r in (*ROW_SIZES, max_rows)})


def graph_shapes(max_tokens: int, max_rows: int, max_seq_len: int) -> list[tuple[int, int]]:
    """The (tokens, rows) prompt shapes captured: a capture's dummy request fits one table row."""
    return [
        (t, r)
        for t in token_sizes(max_tokens)
        for r in row_sizes(t, max_rows)
        if -(-t // r) <= max_seq_len
    ]


def shape_for(shapes: list[tuple[int, int]], tokens: int, rows: int) -> tuple[int, int] | None:
    return min((s for s in shapes if s[0] >= tokens and s[1] >= rows), default=None)


class GraphShapes:
    """The shapes captured, and the one a batch runs padded to: the smallest that holds it (None:
    it runs eagerly). The engine's runner and the twin pad alike through it."""

    def __init__(self, max_bs: int, max_tokens: int, max_rows: int, max_seq_len: int) -> None:
        sizes = capture_sizes(max_bs)
        self.max_bs = sizes[-1] if sizes else 0
        self.decode = [Shape(bs, bs, True) for bs in sizes]
        # the decode shape of each batch size up to max_bs (0: none)
        self._padded = [None] + [
            next(s for s in self.decode if s.rows >= n) for n in range(1, self.max_bs + 1)
        ]
        self._prompt = graph_shapes(max_tokens, max_rows, max_seq_len) if max_tokens else []

    @property
    def prompt(self) -> list[Shape]:
        return [Shape(t, r, False) for t, r in self._prompt]

    def drop_prompt(self) -> None:
        self._prompt = []

    def of(self, batch: Batch) -> Shape | None:
        """The smallest shape that holds the batch (None: none; it runs eagerly)."""
        if batch.phase == "decode":
            return self._padded[batch.size] if batch.size <= self.max_bs else None
        if not batch.is_prefill or not self._prompt:
            return None
        _, cached, device_len = batch.ledger
        found = shape_for(self._prompt, int((device_len - cached).sum()), batch.size)
        return None if found is None else Shape(*found, False)


def graph_fields(tokens: int, rows: int) -> list[tuple[str, type, int]]:
    """A shape's inputs: name, dtype, length."""
    return [
        ("token_rows", np.int64, tokens),  # each token's table row ...
        ("positions", np.int64, tokens),  # ... and position
        ("out_loc", np.int64, tokens),  # where its K and V go
        ("slots", np.int32, tokens),  # out_loc again, as the page table holds it
        ("counted", np.int32, tokens),  # 1: a token of the batch, 0: padding (not routed)
        ("rows", np.int64, rows),
        ("sample_idx", np.int64, rows),  # the tokens whose logits are sampled ...
        ("sample_rows", np.int64, rows),  # ... and where their tokens go: table rows ...
        ("following", np.int64, rows),  # ... and positions
        ("keys", np.int64, rows),  # Philox keys, when the graph samples
        ("temperatures", np.float32, rows),  # 0: greedy
        ("qo_indptr", np.int32, rows + 1),
        ("kv_indptr", np.int32, rows + 1),  # pages
        ("last_page_len", np.int32, rows),
        ("kv_lens", np.int32, rows),  # read on the host only, by the planner
    ]


class GraphRunner:
    """`model(input_ids, positions, ctx, sample_idx)` on static buffers, one graph per shape,
    padded rows and tokens writing to `dummy_slot`. A step's host work is one copy of its inputs
    and a plan. With `capture` False the same padded shapes run eagerly, so outputs are the
    same either way; `sample`: decode graphs sample too (the engine samples the rest)."""

    def __init__(
        self,
        model: torch.nn.Module,
        ctx: ForwardContext,
        wrappers: GraphPlans,
        table: TableManager,
        dummy_slot: int,
        device: torch.device,
        max_bs: int,
        max_tokens: int,
        capture: bool = True,
        sample: bool = False,
    ) -> None:
        self.model, self.ctx, self.wrappers, self.table = model, ctx, wrappers, table
        self.dummy_slot, self.capture, self.sample = dummy_slot, capture, sample
        max_rows = table.max_running_reqs
        self.padding = GraphShapes(max_bs, max_tokens, max_rows, table.max_seq_len)
        self.shapes = self.padding.decode + self.padding.prompt
        self.layouts = {s: Layout(graph_fields(s.tokens, s.rows)) for s in self.shapes}
        nbytes = max(layout.nbytes for layout in self.layouts.values())
        self.staged = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.inputs = {s: self.layouts[s].views(self.staged) for s in self.shapes}
        self.host = {s: np.zeros(self.layouts[s].nbytes, dtype=np.uint8) for s in self.shapes}
        self.host_inputs = {s: self.layouts[s].views(self.host[s]) for s in self.shapes}
        self.ring = staging(device) if device.type == "cuda" else None
        for shape in self.padding.decode:  # every row sampled, a token each: the same each step
            arange = np.arange(shape.rows + 1)
            self.host_inputs[shape]["sample_idx"][:] = arange[:-1]
            self.host_inputs[shape]["qo_indptr"][:] = arange
        vocab = model.model_cfg.vocab_size
        dtype = next(model.parameters()).dtype
        # NOTE: one logits buffer for the prompt shapes: each step's sampling reads it before
        # the next; a decode graph keeps its own (its sampling may read them inside the graph)
        self.logits = torch.empty((max(max_rows, 1), vocab), dtype=dtype, device=device)
        self.graphs: dict[Shape, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[Shape, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.metadata: dict[Shape, object] = {}
        self._plan_all()

    @property
    def prompt_shapes(self) -> list[Shape]:
        """The prefill and mixed shapes (none when the backend cannot plan them alone)."""
        return [s for s in self.shapes if not s.decode]

    def shape(self, batch: Batch) -> Shape | None:
        """The shape the batch runs padded to (None: none holds it; it runs eagerly)."""
        return self.padding.of(batch)

    def padded(self, shape: Shape) -> tuple[int, int]:
        """The rows and tokens the shape runs."""
        return shape.rows, shape.tokens

    def _plan_all(self) -> None:
        """Each shape's attention metadata, then its capture (largest first, so smaller ones
        reuse its memory): planned and captured in turn, as prompt shapes share workspaces."""
        pool, stream = None, None
        if self.staged.device.type == "cuda":
            pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            # NOTE: torch no longer collects garbage before a capture. A collection inside one
            # that destroys another engine's graphs (an LLM dropped without close(), a notebook
            # cell run again) ends this capture ("operation not permitted when stream is
            # capturing"): collect now, and not again until every shape is captured.
            gc.collect()
        with (
            torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext(),
            gc_paused(),
        ):
            for shape in sorted(self.shapes, key=lambda s: (s.tokens, s.rows), reverse=True):
                if shape not in self.layouts:
                    continue  # a prompt shape, after the backend said it cannot plan them
                x = self._stage_dummies(shape)
                # NOTE: outside inference mode: later plans (outside it) update its buffers
                metadata = self.wrappers.metadata(shape, x)
                if metadata is None:
                    self._drop_prompt_shapes()
                    continue
                self.metadata[shape] = metadata
                if self.capture:
                    self._capture(shape, pool, stream)
        if stream is not None:
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()

    def _drop_prompt_shapes(self) -> None:
        """The backend cannot plan a prompt shape alone (a FlashInfer planner we do not know):
        prompt steps run eagerly."""
        for shape in self.prompt_shapes:
            for table in (self.layouts, self.inputs, self.host, self.host_inputs):
                del table[shape]
        self.shapes = [s for s in self.shapes if s.decode]
        self.padding.drop_prompt()

    def _stage_dummies(self, shape: Shape) -> dict[str, torch.Tensor]:
        """A capture's batch: every row the dummy request, its tokens spread over the rows."""
        x = self.inputs[shape]
        for t in x.values():
            t.zero_()
        for name in ("token_rows", "rows", "sample_rows"):
            x[name].fill_(self.table.dummy_row)
        x["out_loc"].fill_(self.dummy_slot)
        x["slots"].fill_(self.dummy_slot)
        x["following"].fill_(1)
        if shape.decode:  # (a prompt shape's are planned by the backend)
            x["kv_indptr"].copy_(torch.arange(shape.rows + 1, dtype=torch.int32))
            x["last_page_len"].fill_(1)
            x["kv_lens"].fill_(1)  # (each reads the dummy slot)
        return x

    def _capture(self, shape: Shape, pool, stream: torch.cuda.Stream) -> None:
        batch = Batch([], shape.phase)
        batch.attn_metadata = self.metadata[shape]
        with self.ctx.running(batch), torch.inference_mode():
            run = functools.partial(self._run, shape)
            self.graphs[shape], self.outputs[shape] = capture(run, pool, stream, self.model.tp.size)

    def _run(self, shape: Shape) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.inputs[shape]
        token_rows, positions = x["token_rows"], x["positions"]
        # NOTE: the host wrote these entries in its own table only; padding writes dummy_slot
        self.table.page_table[token_rows, positions] = x["slots"]
        self.wrappers.graph_indices(shape, x["rows"], x["kv_indptr"])
        input_ids = self.table.token_pool[token_rows, positions]
        logits = counted_forward(
            self.model, self.ctx, x["counted"], input_ids, positions, x["sample_idx"]
        )
        if not shape.decode:
            return self.logits[: shape.rows].copy_(logits), None
        if not self.sample:
            return logits, None
        from ..kernels.sampling import race_sample

        tokens = race_sample(logits, x["temperatures"], x["keys"]).to(torch.int32)
        self.table.token_pool[x["sample_rows"], x["following"]] = tokens
        return logits, tokens

    def prepare(
        self, batch: Batch, shape: Shape, race: tuple[np.ndarray, np.ndarray] | None
    ) -> None:
        """Send the batch's inputs, padded to `shape`, to the static buffers and plan its
        attention. `race`: temperatures and Philox keys when a decode graph samples (None: the
        engine does)."""
        x = self.host_inputs[shape]
        table_rows, cached, device_len = batch.ledger
        n, dummy_row = batch.size, self.table.dummy_row
        if shape.decode:  # a token a row, padding rows too; every row sampled
            total = count = n
            sampled = slice(None)
            x["token_rows"][:n], x["positions"][:n] = table_rows, cached
        else:  # padding tokens belong to no request, padding requests have no token
            extend = device_len - cached
            sampled = batch.sampled_mask()
            total, count = int(extend.sum()), int(sampled.sum())
            ends = np.cumsum(extend)
            x["token_rows"][:total] = np.repeat(table_rows, extend)
            x["positions"][:total] = ranges(cached, device_len)
            x["sample_idx"][:count], x["sample_idx"][count:] = (ends - 1)[sampled], 0
            qo = x["qo_indptr"]
            qo[0], qo[1 : n + 1], qo[n + 1 :] = 0, ends, total
        x["token_rows"][total:], x["positions"][total:] = dummy_row, 0
        slots = self.table.page_table_host[x["token_rows"][:total], x["positions"][:total]]
        x["out_loc"][:total], x["out_loc"][total:] = slots, self.dummy_slot
        x["slots"][:total], x["slots"][total:] = slots, self.dummy_slot
        x["counted"][:total], x["counted"][total:] = 1, 0
        x["rows"][:n], x["rows"][n:] = table_rows, dummy_row
        x["sample_rows"][:count], x["sample_rows"][count:] = table_rows[sampled], dummy_row
        x["following"][:count], x["following"][count:] = device_len[sampled], 1
        temperatures, keys = race if race is not None else (0.0, 0)
        x["temperatures"][:count], x["temperatures"][count:] = temperatures, 0.0
        x["keys"][:count], x["keys"][count:] = keys, 0
        kv_lens = x["kv_lens"]
        kv_lens[:n], kv_lens[n:] = device_len, 1  # a padded request reads the dummy page
        self.wrappers.paged_lens(kv_lens, x["kv_indptr"], x["last_page_len"])
        send_staged(self.ring, self.host[shape], self.staged)
        batch.attn_metadata = self.metadata[shape]
        self.wrappers.plan(shape, x)

    def token_targets(self, shape: Shape, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the batch's `count` sampled tokens go in the token pool (rows, positions)."""
        x = self.inputs[shape]
        return x["sample_rows"][:count], x["following"][:count]

    def replay(self, batch: Batch, shape: Shape) -> torch.Tensor:
        """The logits of the batch's sampled requests; the tokens a decode graph sampled are in
        `tokens(shape, n)`."""
        if not self.capture:
            with self.ctx.running(batch), torch.inference_mode():
                self.outputs[shape] = self._run(shape)
        else:
            self.graphs[shape].replay()
        return self.outputs[shape][0][: len(batch.sampled_reqs)]

    def tokens(self, shape: Shape, count: int) -> torch.Tensor:
        return self.outputs[shape][1][:count]


def capture(run: Callable[[], T], pool, stream: torch.cuda.Stream, tp_size: int):
    """`run` warmed up twice, then captured: the graph and its outputs, which replays rewrite."""
    for _ in range(2):
        run()
    graph = torch.cuda.CUDAGraph()
    # NOTE: NCCL's watchdog thread queries events during the capture: "thread_local" allows it
    mode = "thread_local" if tp_size > 1 else "global"
    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=mode):
        outputs = run()
    return graph, outputs


def counted_forward(
    model: torch.nn.Module,
    ctx: ForwardContext,
    counted: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    sample_idx: torch.Tensor,
) -> torch.Tensor:
    """The model's forward, its MoE routing counting only the tokens whose `counted` is 1 (a
    static buffer the graph reads at each replay): a padded graph's dummy tokens choose experts
    too, but are not the batch's (`ForwardContext.route`)."""
    ctx.counted = counted
    try:
        return model(input_ids, positions, ctx, sample_idx)
    finally:
        ctx.counted = None


def send_staged(ring: Staging | None, host: np.ndarray, staged: torch.Tensor) -> None:
    """`host` to the graph's device buffer `staged` in one copy, through the staging ring on a
    GPU (None: the device is the CPU)."""
    if ring is None:
        staged[: len(host)].copy_(torch.from_numpy(host))
        return
    pinned_np, pinned = ring.region(len(host))
    pinned_np[:] = host
    staged[: len(host)].copy_(pinned, non_blocking=True)


class Layout:
    """Where each input of a graph lies in its staged bytes, the same on the host and device."""

    def __init__(self, fields: Iterable[tuple[str, type, int]]) -> None:
        self.fields: list[tuple[str, np.dtype, int, int]] = []  # name, dtype, offset, length
        at = 0
        for name, dtype, n in fields:
            self.fields.append((name, np.dtype(dtype), at, n))
            at += -(-n * np.dtype(dtype).itemsize // 16) * 16  # each starts 16-byte aligned
        self.nbytes = at

    def views(self, buffer: np.ndarray | torch.Tensor) -> dict:
        if isinstance(buffer, np.ndarray):
            return {
                name: buffer[at : at + n * dt.itemsize].view(dt) for name, dt, at, n in self.fields
            }
        return {
            name: buffer[at : at + n * dt.itemsize].view(_TORCH_DTYPES[dt.type])
            for name, dt, at, n in self.fields
        }


_TORCH_DTYPES = {np.int64: torch.int64, np.int32: torch.int32, np.float32: torch.float32}

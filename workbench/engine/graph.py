"""CUDA graphs for decode: captured once per batch size, replayed with the batch padded by the
dummy request. Python (module hooks included) does not run during a replay."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from ..core import Batch
from ..device import Staging, staging

T = TypeVar("T")

if TYPE_CHECKING:
    from ..attention.context import ForwardContext
    from ..attention.flashinfer_graphs import GraphWrappers
    from ..kvcache.table import TableManager


def capture_sizes(max_bs: int) -> list[int]:
    sizes = {1, 2, 4, 8, *range(16, max_bs + 1, 16), max_bs}
    return sorted(s for s in sizes if s <= max_bs)


class GraphRunner:
    """`model(input_ids, positions, ctx, sample_idx)` on static buffers, padded rows writing to
    `dummy_slot`. A step's host work is one copy of its `Staged` inputs and a plan."""

    def __init__(
        self,
        model: torch.nn.Module,
        ctx: ForwardContext,
        wrappers: GraphWrappers,
        table: TableManager,
        dummy_slot: int,
        device: torch.device,
        max_bs: int,
        capture: bool = True,
        sample: bool = False,
    ) -> None:
        self.model, self.ctx, self.wrappers, self.table = model, ctx, wrappers, table
        self.dummy_slot = dummy_slot
        self.sizes = capture_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        self._padded = [next(s for s in self.sizes if s >= n) for n in range(self.max_bs + 1)]
        self.staged = torch.zeros(Staged(self.max_bs).nbytes, dtype=torch.uint8, device=device)
        self.ring = staging(device)
        self.layouts = {bs: Staged(bs) for bs in self.sizes}
        self.inputs = {bs: self.layouts[bs].views(self.staged) for bs in self.sizes}
        self.host = {bs: np.zeros(self.layouts[bs].nbytes, dtype=np.uint8) for bs in self.sizes}
        self.host_inputs = {bs: self.layouts[bs].views(self.host[bs]) for bs in self.sizes}
        self.sample_idx = torch.arange(self.max_bs, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.metadata: dict[int, object] = {}
        self.capture, self.sample = capture, sample
        self._capture_all()

    def _run(self, bs: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.inputs[bs]
        rows, positions = x["rows"], x["positions"]
        input_ids = self.table.token_pool[rows, positions]
        # NOTE: the host wrote these entries in its own table only; padded rows write dummy_slot
        self.table.page_table[rows, positions] = x["slots"]
        self.wrappers.graph_indices(rows, x["indptr"])
        sample_idx = self.sample_idx[:bs]
        logits = counted_forward(
            self.model, self.ctx, x["counted"], input_ids, positions, sample_idx
        )
        if not self.sample:
            return logits, None
        from ..kernels.sampling import race_sample

        tokens = race_sample(logits, x["temperatures"], x["keys"]).to(torch.int32)
        self.table.token_pool[rows, x["following"]] = tokens
        return logits, tokens

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):  # largest first, so smaller ones reuse its memory
                x = self._stage_dummies(bs)
                batch = Batch([], "decode")
                # NOTE: outside inference mode: later plans (outside it) update its buffers in place
                batch.attn_metadata = self.wrappers.graph_metadata(
                    bs, x["out_loc"], x["indptr"], x["last_page_len"]
                )
                self.metadata[bs] = batch.attn_metadata
                if self.capture:
                    self._capture(bs, batch, pool, stream)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def _stage_dummies(self, bs: int) -> dict[str, torch.Tensor]:
        x = self.inputs[bs]
        for t in x.values():
            t.zero_()
        x["rows"].fill_(self.table.dummy_row)
        x["out_loc"].fill_(self.dummy_slot)
        x["slots"].fill_(self.dummy_slot)
        x["following"].fill_(1)
        x["indptr"].copy_(torch.arange(bs + 1, dtype=torch.int32))
        x["last_page_len"].fill_(1)
        return x

    def _capture(self, bs: int, batch: Batch, pool, stream: torch.cuda.Stream) -> None:
        with self.ctx.running(batch), torch.inference_mode():
            run = functools.partial(self._run, bs)
            self.graphs[bs], self.outputs[bs] = capture(run, pool, stream, self.model.tp.size)

    def shape(self, batch: Batch) -> int | None:
        """The size the batch runs padded to (None: it does not decode, or is too large)."""
        if batch.phase == "decode" and batch.size <= self.max_bs:
            return self._padded[batch.size]
        return None

    def padded(self, bs: int) -> tuple[int, int]:
        return bs, bs

    def prepare(self, batch: Batch, bs: int, race: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Send the batch's inputs, padded to `bs`, to the static buffers and plan its attention.
        `race`: temperatures and Philox keys when the graph samples (None: the engine does)."""
        size = batch.size
        x = self.host_inputs[bs]
        rows, positions, device_len = batch.ledger
        kv_lens = x["kv_lens"]
        kv_lens[:size], kv_lens[size:] = device_len, 1
        x["rows"][:size], x["rows"][size:] = rows, self.table.dummy_row
        x["positions"][:size], x["positions"][size:] = positions, 0
        slots = self.table.page_table_host[rows, positions]
        x["out_loc"][:size], x["out_loc"][size:] = slots, self.dummy_slot
        x["slots"][:size], x["slots"][size:] = slots, self.dummy_slot
        x["following"][:size], x["following"][size:] = device_len, 1
        x["counted"][:size], x["counted"][size:] = 1, 0
        temperatures, keys = race if race is not None else (0.0, 0)
        x["temperatures"][:size], x["temperatures"][size:] = temperatures, 0.0
        x["keys"][:size], x["keys"][size:] = keys, 0
        self.wrappers.paged_lens(kv_lens, x["indptr"], x["last_page_len"])
        send_staged(self.ring, self.host[bs], self.staged)
        batch.attn_metadata = self.metadata[bs]
        self.wrappers.plan_replay(bs, x["indptr"], kv_lens)

    def token_targets(self, bs: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the batch's `count` sampled tokens go in the token pool (rows, positions)."""
        x = self.inputs[bs]
        return x["rows"][:count], x["following"][:count]

    def replay(self, batch: Batch, bs: int) -> torch.Tensor:
        """The batch's logits; the tokens the graph sampled are in `tokens(bs, n)`."""
        if not self.capture:
            with self.ctx.running(batch), torch.inference_mode():
                self.outputs[bs] = self._run(bs)
        else:
            self.graphs[bs].replay()
        return self.outputs[bs][0][: batch.size]

    def tokens(self, bs: int, count: int) -> torch.Tensor:
        return self.outputs[bs][1][:count]


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


def send_staged(ring: Staging, host: np.ndarray, staged: torch.Tensor) -> None:
    """`host` to the graph's device buffer `staged` in one copy, through the staging ring."""
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


class Staged(Layout):
    FIELDS = (  # name, dtype, length beyond bs
        ("rows", np.int64, 0),
        ("positions", np.int64, 0),
        ("out_loc", np.int64, 0),
        ("following", np.int64, 0),  # the position its sampled token takes
        ("keys", np.int64, 0),
        ("temperatures", np.float32, 0),  # 0: greedy
        ("slots", np.int32, 0),  # out_loc again, as the page table holds it
        ("indptr", np.int32, 1),
        ("last_page_len", np.int32, 0),
        ("kv_lens", np.int32, 0),  # read on the host only, by the planner
        ("counted", np.int32, 0),  # 1: a row of the batch, 0: padding (its routing not counted)
    )

    def __init__(self, bs: int) -> None:
        super().__init__((name, dtype, bs + extra) for name, dtype, extra in self.FIELDS)


_TORCH_DTYPES = {np.int64: torch.int64, np.int32: torch.int32, np.float32: torch.float32}

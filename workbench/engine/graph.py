"""CUDA graphs for decode: captured once per batch size, replayed with the batch padded by the
dummy request. Python (module hooks included) does not run during a replay; the scheduler-side
records do not depend on it. Without capture, the runner runs the same padded batches eagerly."""

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
    from ..attention.base import AttentionBackend
    from ..attention.context import ForwardContext
    from ..kvcache.table import TableManager


def capture_sizes(max_bs: int) -> list[int]:
    sizes = {1, 2, 4, 8, *range(16, max_bs + 1, 16), max_bs}
    return sorted(s for s in sizes if s <= max_bs)


class GraphRunner:
    """`model(input_ids, positions, ctx, sample_idx)` run on static buffers; padded rows write
    their K and V to `dummy_slot`, which no request reads.

    A decode step's host work is one copy and a plan. The host packs, for each request, its
    table row, position, KV slot, the position of its next token and, with `sample`, its
    temperature and Philox key, and the attention's page `indptr` and last-page lengths
    (`Staged`), sends them in one copy, and runs FlashInfer's planner on the KV lengths. The
    graph does the rest on the device: the input ids from the token pool, the new KV slots
    into the page table, the page ids from the page table (`graph_indices`), the forward, and
    with `sample` the one-pass sampler (`kernels/sampling.py`) and the tokens into the token
    pool."""

    def __init__(
        self,
        model: torch.nn.Module,
        ctx: ForwardContext,
        backend: AttentionBackend,
        table: TableManager,
        dummy_slot: int,
        device: torch.device,
        max_bs: int,
        capture: bool = True,
        sample: bool = False,
    ) -> None:
        self.model, self.ctx, self.backend, self.table = model, ctx, backend, table
        self.dummy_slot = dummy_slot
        self.sizes = capture_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        self._padded = [next(s for s in self.sizes if s >= n) for n in range(self.max_bs + 1)]
        self.staged = torch.zeros(Staged(self.max_bs).nbytes, dtype=torch.uint8, device=device)
        self.ring = staging(device)
        self.layouts = {bs: Staged(bs) for bs in self.sizes}
        self.inputs = {bs: self.layouts[bs].views(self.staged) for bs in self.sizes}
        # the host side: each size's bytes and their views, filled in place per step
        self.host = {bs: np.zeros(self.layouts[bs].nbytes, dtype=np.uint8) for bs in self.sizes}
        self.host_inputs = {bs: self.layouts[bs].views(self.host[bs]) for bs in self.sizes}
        self.sample_idx = torch.arange(self.max_bs, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.metadata: dict[int, object] = {}
        self.capture, self.sample = capture, sample
        self._capture_all()

    def _run(self, bs: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One padded decode step from the staged inputs (what a graph captures): the logits,
        and with `sample` the tokens, written to the token pool too."""
        x = self.inputs[bs]
        rows, positions = x["rows"], x["positions"]
        input_ids = self.table.token_pool[rows, positions]
        # NOTE: the host wrote these entries in its own table only (`CacheManager.allocate`);
        # padded rows write the dummy row's first entry, which holds the dummy slot already
        self.table.page_table[rows, positions] = x["slots"]
        self.backend.graph_indices(rows, x["indptr"])
        logits = self.model(input_ids, positions, self.ctx, self.sample_idx[:bs])
        if not self.sample:
            return logits, None
        from ..kernels.sampling import race_sample

        tokens = race_sample(logits, x["temperatures"], x["keys"]).to(torch.int32)
        self.table.token_pool[rows, x["following"]] = tokens  # padded rows: the dummy row's
        return logits, tokens

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):  # largest first, so smaller ones reuse its memory
                x = self._stage_dummies(bs)
                batch = Batch([], "decode")
                # NOTE: outside inference mode: the wrapper's buffers are updated in place by
                # every later plan(), which runs outside it.
                batch.attn_metadata = self.backend.graph_metadata(
                    bs, x["out_loc"], x["indptr"], x["last_page_len"]
                )
                self.metadata[bs] = batch.attn_metadata
                if self.capture:
                    self._capture(bs, batch, pool, stream)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def _stage_dummies(self, bs: int) -> dict[str, torch.Tensor]:
        """Inputs of `bs` dummy requests (greedy, one KV token each), for the warm-up and
        capture."""
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
        """Requests and tokens a batch padded to `bs` runs as: a token each."""
        return bs, bs

    def prepare(self, batch: Batch, bs: int, race: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Send the batch's inputs, padded to `bs` with dummy requests, to the static buffers
        (one copy), and plan the captured attention for them. `race`: each request's
        temperature and Philox key when the graph samples them (None: the engine samples from
        the logits)."""
        size = batch.size
        x = self.host_inputs[bs]
        rows, positions, device_len = batch.ledger
        kv_lens = x["kv_lens"]
        kv_lens[:size], kv_lens[size:] = device_len, 1  # a dummy request reads its dummy slot
        x["rows"][:size], x["rows"][size:] = rows, self.table.dummy_row
        x["positions"][:size], x["positions"][size:] = positions, 0
        slots = self.table.page_table_host[rows, positions]
        x["out_loc"][:size], x["out_loc"][size:] = slots, self.dummy_slot
        x["slots"][:size], x["slots"][size:] = slots, self.dummy_slot
        x["following"][:size], x["following"][size:] = device_len, 1  # where each next token goes
        temperatures, keys = race if race is not None else (0.0, 0)
        x["temperatures"][:size], x["temperatures"][size:] = temperatures, 0.0
        x["keys"][:size], x["keys"][size:] = keys, 0
        self.backend.paged_lens(kv_lens, x["indptr"], x["last_page_len"])
        send_staged(self.ring, self.host[bs], self.staged)
        batch.attn_metadata = self.metadata[bs]
        self.backend.plan_replay(bs, x["indptr"], kv_lens)

    def token_targets(self, bs: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the batch's `count` sampled tokens go in the token pool: rows and positions,
        on the device already (staged with the inputs)."""
        x = self.inputs[bs]
        return x["rows"][:count], x["following"][:count]

    def replay(self, batch: Batch, bs: int) -> torch.Tensor:
        """The batch's logits; when the graph samples, its tokens are in `tokens(bs, n)` and
        the token pool."""
        if not self.capture:  # the same padded computation, run eagerly
            with self.ctx.running(batch), torch.inference_mode():
                self.outputs[bs] = self._run(bs)
        else:
            self.graphs[bs].replay()
        return self.outputs[bs][0][: batch.size]

    def tokens(self, bs: int, count: int) -> torch.Tensor:
        """The tokens the last replay of the `bs` graph sampled."""
        return self.outputs[bs][1][:count]


def capture(run: Callable[[], T], pool, stream: torch.cuda.Stream, tp_size: int):
    """`run` warmed up twice (no lazy initialisation inside the capture), then captured into a
    CUDA graph on `stream`, in the graph memory `pool`: the graph and what `run` returned (its
    outputs, which each replay rewrites)."""
    for _ in range(2):
        run()
    graph = torch.cuda.CUDAGraph()
    # NOTE: with tensor parallelism NCCL's watchdog thread queries events while this thread
    # captures; "thread_local" keeps its calls legal (the default mode fails them)
    mode = "thread_local" if tp_size > 1 else "global"
    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=mode):
        outputs = run()
    return graph, outputs


def send_staged(ring: Staging, host: np.ndarray, staged: torch.Tensor) -> None:
    """A graph's inputs, packed in `host`, to its static device buffer `staged`: one copy.

    Through the staging ring's pinned memory, which stays unchanged until the copy has run (the
    host bytes are rewritten next step)."""
    pinned_np, pinned = ring.region(len(host))
    pinned_np[:] = host
    staged[: len(host)].copy_(pinned, non_blocking=True)


class Layout:
    """Where each input of a graph lies in its staged bytes: the same layout on the host
    (packed each step) and on the device (the graph's static inputs). `fields`: name, numpy
    dtype and length of each."""

    def __init__(self, fields: Iterable[tuple[str, type, int]]) -> None:
        self.fields: list[tuple[str, np.dtype, int, int]] = []  # name, dtype, offset, length
        at = 0
        for name, dtype, n in fields:
            self.fields.append((name, np.dtype(dtype), at, n))
            at += -(-n * np.dtype(dtype).itemsize // 16) * 16  # each starts 16-byte aligned
        self.nbytes = at

    def views(self, buffer: np.ndarray | torch.Tensor) -> dict:
        """Each field as a view of `buffer` (uint8, host numpy or device torch)."""
        if isinstance(buffer, np.ndarray):
            return {
                name: buffer[at : at + n * dt.itemsize].view(dt) for name, dt, at, n in self.fields
            }
        return {
            name: buffer[at : at + n * dt.itemsize].view(_TORCH_DTYPES[dt.type])
            for name, dt, at, n in self.fields
        }


class Staged(Layout):
    """The inputs of a padded decode batch of `bs` requests."""

    FIELDS = (  # name, dtype, length beyond bs
        ("rows", np.int64, 0),  # table rows
        ("positions", np.int64, 0),  # of the token each request computes
        ("out_loc", np.int64, 0),  # its KV slot
        ("following", np.int64, 0),  # the position its sampled token takes
        ("keys", np.int64, 0),  # Philox keys
        ("temperatures", np.float32, 0),  # 0: greedy
        ("slots", np.int32, 0),  # out_loc again, as the page table holds it
        ("indptr", np.int32, 1),  # where each request's KV pages start (FlashInfer)
        ("last_page_len", np.int32, 0),  # KV tokens in each request's last page
        ("kv_lens", np.int32, 0),  # KV tokens per request (FlashInfer's planner, on the host)
    )

    def __init__(self, bs: int) -> None:
        super().__init__((name, dtype, bs + extra) for name, dtype, extra in self.FIELDS)


_TORCH_DTYPES = {np.int64: torch.int64, np.int32: torch.int32, np.float32: torch.float32}

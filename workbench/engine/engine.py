"""The Engine: model, KV pool, tables and attention backend on one device; forwards one batch."""

from __future__ import annotations

import gc
from typing import NamedTuple

import numpy as np
import torch

from ..attention import create_backend
from ..attention.context import ForwardContext
from ..config import EngineConfig
from ..core import Batch, Req
from ..device import DeviceTimer, to_device_many
from ..distributed import SINGLE, TPGroup
from ..kvcache.pool import KVPool
from ..kvcache.table import TableManager
from ..models import ModelConfig, resolve
from ..models.decoder import check_tp_size
from ..models.weights import build_model
from ..profiling import release_cupti_at_stop
from ..stages import StageClock
from .graph import GraphRunner
from .inputs import fill_inputs
from .memory import check_fits, out_of_memory, pages_from_memory
from .placement import check_gpus, num_devices, rank_device, use_cpu_threads
from .prefill_graph import PrefillGraphRunner
from .ranks import OneRank, Ranks
from .ranks import start as start_ranks
from .sampler import Sampler


class Engine:
    def __init__(self, config: EngineConfig, tp: TPGroup | None = None) -> None:
        """`tp`: this process's rank of a tensor-parallel engine above 0 (`worker.py` builds
        it); None: this is rank 0 (which starts the others, `ranks.py`), or the only one."""
        self.config, self.dtype = config, config.torch_dtype
        self.model_dir = resolve(config.model)
        self.model_config = model_cfg = ModelConfig.from_dir(self.model_dir)
        check_tp_size(model_cfg, config.tp_size)  # before any process or memory is taken
        use_cpu_threads(config)
        # rank 0 of several: the others (`OneRank` for an engine alone, or a rank above 0)
        self.ranks: Ranks | OneRank = OneRank()
        self.launches = 0  # steps run (each rank counts the same)
        if tp is None and config.tp_size > 1:
            check_gpus(config)
            tp, self.ranks = start_ranks(config)
        self.tp = tp or SINGLE
        self.device = rank_device(config, self.tp.rank) if self.tp.size > 1 else config.torch_device
        self.num_devices = num_devices(config)  # GPUs the ranks run on (gloo's may share)
        if self.device.type == "cuda":  # a profiler of the user's own leaves CUPTI behind too
            release_cupti_at_stop()
        try:
            self._build(config, model_cfg)
        except BaseException:
            self.close()  # the other ranks too: a failed engine leaves nothing running
            raise

    def _build(self, config: EngineConfig, model_cfg: ModelConfig) -> None:
        """The model, KV pool, request table, attention backend, sampler and CUDA graphs."""
        self.max_seq_len = config.max_seq_len or min(
            model_cfg.max_position_embeddings, config.max_seq_len_cap
        )
        check_fits(config, model_cfg, self.device, self.tp)
        self.model = build_model(
            model_cfg,
            self.max_seq_len,
            self.device,
            self.dtype,
            self.model_dir,
            config.seed,
            self.tp,
        )
        self.model.use_fused_kernels(config.fused_kernels_enabled, config.fused_rope_enabled)
        self._build_memory(config, model_cfg)
        self.ctx = ForwardContext(self.backend)
        self.sampler = Sampler(
            model_cfg.vocab_size, self.device, config.seed, fused=config.fused_sampling_enabled
        )
        if self.device.type == "cuda":
            self._token_host = [
                torch.empty(config.max_running_reqs, dtype=torch.int32, pin_memory=True)
                for _ in range(4)
            ]
        self._build_graphs(config)
        # NOTE: one full collection now makes the start-up objects (torch, transformers, the
        # model) long-lived; otherwise the first full collection can fall inside a run (seen on
        # the CPU with record="light": one pass of 0.19 s in a 300-step run).
        gc.collect()

    def _build_memory(self, config: EngineConfig, model_cfg: ModelConfig) -> None:
        """The KV pool, the request table over it and the attention backend that reads them."""
        # NOTE: every rank must have the same slots: rank 0 allocates them for all
        pages = config.num_pages or pages_from_memory(config, model_cfg, self.device, self.tp)
        self.num_pages = config.num_pages or self.tp.min_int(pages, self.device)
        self.pool = KVPool(
            model_cfg.num_layers,
            self.num_pages,
            config.page_size,
            model_cfg.num_kv_heads // self.tp.size,  # this rank's KV heads
            model_cfg.head_dim,
            self.dtype,
            self.device,
        )
        # NOTE: whole pages: a request near the context limit allocates its last page in full.
        width = -(-self.max_seq_len // config.page_size) * config.page_size
        self.table = TableManager(config.max_running_reqs, width, self.device)
        if self.ranks.keeps_journal:
            self.table.journal = []  # what the other ranks replay before each step
        self.backend = create_backend(
            config.attention_backend,
            pool=self.pool,
            table=self.table,
            num_heads=model_cfg.num_heads // self.tp.size,
            head_dim=model_cfg.head_dim,
            decode_tensor_cores=config.decode_tensor_cores,
        )
        # padded (dummy) requests read the dummy slot, never a live request's KV
        self.table.write_row(
            self.table.dummy_row, 0, np.full(width, self.pool.dummy_slot, np.int32)
        )

    def _build_graphs(self, config: EngineConfig) -> None:
        """The CUDA graphs of decode steps and of prefill and mixed steps (on a GPU whose
        backend has them).

        With cuda_graph=False, those steps still run padded to the same shapes, only eagerly:
        the same kernels on the same shapes, so outputs are identical either way."""
        self.graphs: GraphRunner | None = None
        self.prefill_graphs: PrefillGraphRunner | None = None
        if self.device.type != "cuda" or not self.backend.supports_cuda_graph:
            return
        oom = None
        common = (self.model, self.ctx, self.backend, self.table, self.pool.dummy_slot)
        try:
            self.graphs = GraphRunner(
                *common,
                self.device,
                min(config.cuda_graph_max_bs, config.max_running_reqs),
                capture=config.cuda_graph_enabled,
                sample=config.fused_sampling_enabled,
            )
            if config.cuda_graph_max_tokens:
                try:
                    self.prefill_graphs = PrefillGraphRunner(
                        *common,
                        self.device,
                        config.cuda_graph_max_tokens,
                        capture=config.cuda_graph_enabled,
                    )
                except NotImplementedError:  # a FlashInfer whose planner we cannot call alone
                    self.prefill_graphs = None
        except torch.cuda.OutOfMemoryError as exc:
            oom = str(exc).split("\n")[0]
        # NOTE: raised outside the except block: the out-of-memory error's frames hold the
        # half-captured graphs' memory, and a chained error (kept by a notebook) keeps them
        if oom is not None:
            error = out_of_memory(config, self.model_config, self.num_pages, oom)
            self.close()
            gc.collect()
            torch.cuda.empty_cache()
            raise error

    def close(self) -> None:
        """Drop every tensor the engine holds (the caller then frees the cached memory); stop
        the other ranks."""
        self.graphs = self.prefill_graphs = None
        self.model = self.pool = self.table = self.backend = None
        self.ctx = self.sampler = None
        ranks, self.ranks = self.ranks, OneRank()
        ranks.close()

    def runner(self, batch: Batch) -> GraphRunner | PrefillGraphRunner | None:
        """The graph runner that runs this batch padded (captured or eager), None: it runs
        unpadded and eagerly."""
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs
        if self.prefill_graphs is not None and self.prefill_graphs.can_run(batch):
            return self.prefill_graphs
        return None

    def uses_graph(self, batch: Batch) -> bool:
        """Whether this batch runs through a padded graph path (captured or eager), which
        writes its new page-table entries on the device itself."""
        return self.runner(batch) is not None

    @property
    def captures_graphs(self) -> bool:
        """Whether the padded steps replay captured CUDA graphs (not run eagerly)."""
        return self.graphs is not None and self.graphs.capture

    def padded_size(self, batch: Batch) -> int:
        """The requests the batch runs as (padded rows included)."""
        runner = self.runner(batch)
        return batch.size if runner is None else runner.padded_rows(batch)

    def padded_tokens(self, batch: Batch) -> int:
        """The tokens the batch runs as, padding included (of a prepared batch: its ledger)."""
        runner = self.runner(batch)
        if runner is not None:
            return runner.padded_tokens(batch)
        _, cached, device_len = batch.ledger
        return int((device_len - cached).sum())

    def prepare(self, batch: Batch) -> None:
        """The inputs (`fill_inputs`) and attention metadata (`plan`) of a batch whose ledger
        (`Batch.snapshot`) and pages are ready."""
        self.fill_inputs(batch)
        self.plan(batch)

    def fill_inputs(self, batch: Batch) -> None:
        """The batch's device inputs: a CUDA graph's static buffers (one copy), or positions,
        input ids, KV slots and sampled rows of its own (`inputs.py`)."""
        runner = self.runner(batch)
        if runner is None:
            fill_inputs(batch, self.table)
        elif runner is self.graphs:  # a decode graph samples too
            runner.fill_inputs(batch, self.sampler.race_inputs(batch.reqs, batch.ledger[2] + 1))
        else:
            runner.fill_inputs(batch)

    def plan(self, batch: Batch) -> None:
        """The attention metadata of a batch whose inputs are filled in."""
        runner = self.runner(batch)
        if runner is not None:
            runner.plan(batch)
        else:
            self.backend.prepare(batch)

    def run_batch(self, batch: Batch, clock: StageClock | None = None) -> DeviceStep:
        """The device side of a step: the forward, each request's ledger moved past it
        (`complete_one`), the next token of every request that finished its prompt sampled and
        written to the token pool (where the next decode reads it), and a copy of those tokens
        to the host started. On a GPU all of it is only enqueued; wait on `done` before reading
        `tokens`. `clock` is told the stage running ("forward", then "sample"): a failure
        names it, and the step's host time is split by it."""
        clock = clock if clock is not None else StageClock()
        clock.enter("forward")
        launch, self.launches = self.launches, self.launches + 1
        self.ranks.launch(batch, self.table)
        with self.ranks.alive():
            timer = DeviceTimer(self.device)
            timer.start()
            self.backend.launched(timer)  # the plan's copies are behind its start
            logits = self.forward(batch)
            Req.complete_all(batch.reqs)
            clock.enter("sample")
            tokens = self.sample(batch, logits)
            timer.stop()  # behind the tokens' copy to the host
        done = timer.stopped if self.device.type == "cuda" and len(tokens) else None
        return DeviceStep(tokens, done, timer, self.tp.size, launch)

    def wait(self, step: DeviceStep) -> None:
        """Until `step`'s tokens are on the host (with other ranks, watching them)."""
        if step.done is not None:
            self.ranks.wait(step.done)

    def rank_device_ms(self) -> dict[int, list[float]]:
        """With tensor parallelism: the device time of each step not asked about before on
        ranks 1.. (launch -> ms per rank), from each rank's own timer."""
        return self.ranks.device_ms()

    def rank_events(self) -> dict[int, list[list[tuple]]]:
        """With tensor parallelism: the profiler events of ranks 1.. of the steps they
        profiled (those rank 0's profiler recorded) since the last call, launch -> a list per
        rank, each on that rank's own clock."""
        return self.ranks.events()

    def check_ranks(self) -> None:
        """With tensor parallelism: every rank's request table (page table, token pool) equals
        rank 0's, so the ranks read and write the same KV slots."""
        differ = self.ranks.same_tables(self.table)
        if differ:
            raise AssertionError(
                f"tensor-parallel ranks {differ} hold a request table unlike rank 0's"
            )

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [sampled requests, vocab] in the model's dtype."""
        runner = self.runner(batch)
        if runner is not None:
            return runner.replay(batch)  # (a replay needs no inference mode)
        with torch.inference_mode(), self.ctx.running(batch) as ctx:
            return self.model(batch.input_ids, batch.positions, ctx, batch.sample_idx)

    def sample(self, batch: Batch, logits: torch.Tensor) -> torch.Tensor:
        """The tokens of the batch's sampled requests, written to the token pool (where the
        next decode reads them) and, on a GPU, copied to pinned host memory (asynchronously:
        ready when the step's timer has stopped)."""
        reqs = batch.sampled_reqs
        if not reqs:
            return torch.zeros(0, dtype=torch.int32)
        runner = self.runner(batch)
        if runner is not None and runner.sampled:
            tokens = runner.tokens(batch)  # sampled in the graph, into the token pool too
        else:
            sampled = batch.sampled_mask()
            launched_lens = batch.ledger[2][sampled]  # each sampled token's position
            tokens = self.sampler.sample(logits, self.sampler.prepare(reqs, launched_lens + 1))
            if runner is not None:
                rows, cols = runner.token_targets(batch)
            else:
                rows, cols = to_device_many([batch.ledger[0][sampled], launched_lens], self.device)
            self.table.token_pool[rows, cols] = tokens  # where the next decode reads them
        if self.device.type != "cuda":
            return tokens
        # NOTE: pinned buffers taken in turn: a step's tokens are read at its collect, at most
        # one step later (overlap); four leave room
        host = self._token_host[self.launches % len(self._token_host)][: len(reqs)]
        host.copy_(tokens, non_blocking=True)
        return host


class DeviceStep(NamedTuple):
    """What `Engine.run_batch` enqueued: the sampled tokens' host copy and when it is ready."""

    tokens: torch.Tensor  # int32 [sampled requests], on the host (filled asynchronously)
    done: torch.cuda.Event | None  # after the copy (the timer's stop); None: nothing to wait for
    timer: DeviceTimer  # the step's device time
    tp_size: int = 1  # processes the step ran on (tensor parallelism)
    launch: int = 0  # the engine's count of steps before this one (the same on every rank)

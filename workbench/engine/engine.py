"""The Engine: model, KV pool, tables and attention backend on one device; forwards one batch."""

from __future__ import annotations

import functools
import gc
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..attention import create_backend
from ..attention.context import ForwardContext
from ..config import EngineConfig
from ..core import Batch
from ..device import DeviceTimer, to_host
from ..distributed import SINGLE, TPGroup
from ..kvcache.pool import KVPool
from ..kvcache.table import TableManager
from ..models import ModelConfig, resolve
from ..models.decoder import check_tp_size
from ..models.weights import build_model
from ..profiling import release_cupti_at_stop
from .graph import GraphRunner, Shape
from .inputs import (
    fill_inputs,
    prompt_logprob_rows,
    prompt_tokens,
    write_penalized_prefixes,
    write_prompts,
)
from .memory import check_kv_fits, check_weights_fit, out_of_memory, pages_from_memory
from .placement import check_gpus, num_devices, rank_device, use_cpu_threads
from .ranks import Ranks
from .ranks import start as start_ranks
from .sampler import Sampler, SamplingArgs


class Engine:
    def __init__(self, config: EngineConfig, tp: TPGroup | None = None) -> None:
        """`tp`: this rank's group when above 0 (`worker.py`); None: rank 0, or the only one."""
        self.config, self.dtype = config, config.torch_dtype
        self.model_dir = resolve(config.model)
        self.model_config = model_cfg = ModelConfig.from_dir(self.model_dir)
        check_tp_size(model_cfg, config.tp_size)  # before any process or memory is taken
        use_cpu_threads(config)
        self.ranks: Ranks | None = None
        self.launches = 0
        if tp is None and config.tp_size > 1:
            check_gpus(config)
            tp, self.ranks = start_ranks(config)
        self.tp = tp or SINGLE
        self.device = rank_device(config, self.tp.rank) if self.tp.size > 1 else config.torch_device
        self.num_devices = num_devices(config)
        if self.device.type == "cuda":  # a profiler of the user's own leaves CUPTI behind too
            release_cupti_at_stop()
        try:
            self._build(config, model_cfg)
        except BaseException as exc:
            self.close()  # the other ranks too: a failed engine leaves nothing running
            give_back(exc, self.device)
            raise

    def _build(self, config: EngineConfig, model_cfg: ModelConfig) -> None:
        if config.fused_kernels and not config.has_flashinfer:
            raise ValueError(
                f"fused_kernels=True runs FlashInfer's norm, RoPE and SiLU kernels (a CUDA device "
                f"with flashinfer installed), device is {config.torch_device}; allowed here: "
                "False or None"
            )
        self.max_seq_len = config.max_seq_len or min(
            model_cfg.max_position_embeddings, config.max_seq_len_cap
        )
        if self.max_seq_len > model_cfg.max_position_embeddings:  # (before RoPE's tables)
            raise ValueError(
                f"max_seq_len={self.max_seq_len:,} is longer than the model's context "
                f"(max_position_embeddings={model_cfg.max_position_embeddings:,}: positions "
                "beyond it were never trained); give max_seq_len at most that"
            )
        check_weights_fit(config, model_cfg, self.device, self.tp)
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
        self.model.use_small_gemm(config.small_gemm_enabled)
        self.model.use_pdl(config.pdl_enabled)
        self.model.use_moe_backend(config.moe_backend_used)
        self._build_memory(config, model_cfg)
        self.kernels = self._kernels()
        self.ctx = ForwardContext(self.backend)
        # the decoder layers whose MoE blocks count their experts' tokens in `ctx.routing`
        self.moe_layers: tuple[int, ...] = tuple(model_cfg.moe_layers) if model_cfg.is_moe else ()
        if self.moe_layers:  # NOTE: before the graphs are captured: they add into this buffer
            shape = (len(self.moe_layers), model_cfg.num_experts)
            self.ctx.routing = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self.sampler = Sampler(
            model_cfg.vocab_size,
            self.device,
            config.seed,
            fused=config.fused_sampling_enabled,
            token_pool=self.table.token_pool,
        )
        if self.device.type == "cuda":
            self._token_host = [
                torch.empty(config.max_running_reqs, dtype=torch.int32, pin_memory=True)
                for _ in range(4)
            ]
        self._build_graphs(config)
        collect_start_up()

    def _build_memory(self, config: EngineConfig, model_cfg: ModelConfig) -> None:
        # NOTE: every rank must have the same slots: rank 0 allocates them for all
        pages = config.num_pages or pages_from_memory(config, model_cfg, self.device, self.tp)
        self.num_pages = config.num_pages or self.tp.min_int(pages, self.device)
        check_kv_fits(config, model_cfg, self.device, self.tp, self.num_pages)
        self.pool = KVPool(
            model_cfg.num_layers,
            self.num_pages,
            config.page_size,
            model_cfg.num_kv_heads // self.tp.size,
            model_cfg.head_dim,
            self.dtype,
            self.device,
        )
        # NOTE: whole pages: a request near the context limit allocates its last page in full.
        width = -(-self.max_seq_len // config.page_size) * config.page_size
        self.table = TableManager(config.max_running_reqs, width, self.device)
        if self.ranks is not None:
            self.table.journal = []
        self.backend = create_backend(
            config.attention_backend,
            pool=self.pool,
            table=self.table,
            num_heads=model_cfg.num_heads // self.tp.size,
            head_dim=model_cfg.head_dim,
            decode_tensor_cores=config.decode_tensor_cores,
            decode_split_kv=config.decode_split_kv,
            decode_kernel=config.decode_kernel,
            pdl=config.pdl_enabled,
        )
        # padded (dummy) requests read the dummy slot, never a live request's KV
        self.table.write_row(
            self.table.dummy_row, 0, np.full(width, self.pool.dummy_slot, np.int32)
        )
        self.table.sync_device()

    def _build_graphs(self, config: EngineConfig) -> None:
        """CUDA graphs of decode, prefill and mixed steps. With cuda_graph=False (or a backend
        whose graphs run eagerly) the same padded shapes run eagerly, so outputs are identical
        either way."""
        self.graphs: GraphRunner | None = None
        graphs = self.backend.graphs
        if graphs is None or not config.padded_steps_on(graphs.capturable):
            return
        oom = None
        try:
            self.graphs = GraphRunner(
                self.model,
                self.ctx,
                graphs,
                self.table,
                self.pool.dummy_slot,
                self.device,
                min(config.cuda_graph_max_bs, config.max_running_reqs),
                config.cuda_graph_max_tokens,
                capture=config.cuda_graph_enabled and graphs.capturable,
                sample=config.fused_sampling_enabled,
            )
        except torch.cuda.OutOfMemoryError as exc:
            oom = str(exc).split("\n")[0]
        # NOTE: raised outside the except block, whose frames hold the half-captured graphs
        if oom is not None:
            error = out_of_memory(config, self.model_config, self.num_pages, oom)
            self.close()
            gc.collect()
            torch.cuda.empty_cache()
            raise error

    def close(self) -> None:
        """Drop every tensor the engine holds and stop the other ranks."""
        self.graphs = None
        self.model = self.pool = self.table = self.backend = None
        self.ctx = self.sampler = None
        ranks, self.ranks = self.ranks, None
        if ranks is not None:
            ranks.close()

    @property
    def captures_graphs(self) -> bool:
        """Whether the padded steps replay captured CUDA graphs (not run eagerly)."""
        return self.graphs is not None and self.graphs.capture

    def _kernels(self) -> dict[str, Any]:
        """What the model's steps run on, every choice resolved (a saved run carries it): the
        attention backend and decode steps' kernel, the cores FlashInfer's decode runs on and
        its KV split (None where they do not apply), and which fused or Triton kernels are on."""
        config, cores = self.config, self.backend.decode_cores
        # FlashInfer's KV split is an option of its tensor-core graphs only
        tensor_cores = cores is not None and self.backend.tensor_cores_above != float("inf")
        return {
            "attention": config.attention_backend,
            "decode_attention": config.decode_attention,
            "decode_cores": cores,
            "decode_split_kv": config.decode_split_kv if tensor_cores else None,
            "fused_kernels": config.fused_kernels_enabled,
            "fused_rope": config.fused_rope_enabled,
            "fused_sampling": config.fused_sampling_enabled,
            "small_gemm": config.small_gemm_enabled,
            "pdl": config.pdl_enabled,
            "moe_backend": config.moe_backend_used if self.model_config.is_moe else None,
        }

    def prepare(self, batch: Batch, prompt_ids: np.ndarray | None = None) -> Launch:
        """Decide how the batch runs and make every device-side write of its step. `prompt_ids`:
        the prompt tokens it computes (None: read from the requests)."""
        table = self.table
        if table.unsynced:
            table.sync_device()
        if prompt_ids is None and batch.num_decode < batch.size:
            prompt_ids = prompt_tokens(batch)
        if batch.num_decode < batch.size:
            write_penalized_prefixes(batch, table)
        # NOTE: a step that computes prompt log probabilities runs eagerly (more rows of logits)
        extra = prompt_logprob_rows(batch)
        runner, shape = self._runner_for(batch) if extra is None else (None, None)
        launch = Launch(batch, runner, shape, prompt_ids, self.tp.size, moe_layers=self.moe_layers)
        sampled = batch.sampled_mask()
        reqs, lens = batch.sampled_reqs, batch.ledger[2][sampled]
        if runner is None:
            rows = None if extra is None else extra[0]
            launch.targets = fill_inputs(batch, table, sampled, prompt_ids, rows)
            self.backend.prepare(batch)
            launch.padded_rows, launch.padded_tokens = batch.size, len(batch.positions)
        else:
            if prompt_ids is not None:
                write_prompts(batch, table, prompt_ids)
            race = None
            if shape.decode and runner.sample:
                race = self.sampler.race_inputs(reqs, lens + 1)
            runner.prepare(batch, shape, race)
            launch.sampled_in_graph = race is not None
            launch.padded_rows, launch.padded_tokens = runner.padded(shape)
            launch.cuda_graph = runner.capture
            if reqs and not launch.sampled_in_graph:
                launch.targets = runner.token_targets(shape, len(reqs))
        if reqs and not launch.sampled_in_graph:
            launch.sampling = self.sampler.prepare(reqs, lens + 1)
        if self.tp.rank == 0:  # (the other ranks' tokens are not read)
            launch.logprobs = self.sampler.logprob_rows(reqs)
            if extra is not None:
                launch.prompt_logprobs = (*_prompt_targets(batch, extra[1]), extra[1])
        return launch

    def _runner_for(self, batch: Batch) -> tuple[GraphRunner | None, Shape | None]:
        shape = None if self.graphs is None else self.graphs.shape(batch)
        return (None, None) if shape is None else (self.graphs, shape)

    def forward(self, launch: Launch) -> torch.Tensor:
        """Enqueue the prepared batch's forward (on every rank); its sampled requests' logits."""
        launch.index, self.launches = self.launches, self.launches + 1
        batch, runner = launch.batch, launch.runner
        try:
            if self.ranks is not None:
                self.ranks.launch(batch, self.table, launch.prompt_ids)
            timer = launch.timer = DeviceTimer(self.device)
            if timer.cuda:
                self.backend.launched(timer)  # the plan's copies are behind its start
            if self.ctx.routing is not None:  # counted anew by each forward (a graph's too)
                self.ctx.routing.zero_()
            if runner is not None:
                return runner.replay(batch, launch.shape)
            with torch.inference_mode(), self.ctx.running(batch) as ctx:
                return self.model(batch.input_ids, batch.positions, ctx, batch.sample_idx)
        except Exception:
            self._check_ranks_alive()
            raise

    def sample(self, launch: Launch, logits: torch.Tensor) -> None:
        """Enqueue the sampling and the tokens' copies. Read `launch.tokens` after `wait`."""
        count = len(launch.batch.sampled_reqs)
        try:
            if launch.prompt_logprobs is not None:  # its rows after the sampled ones
                targets, top, _ = launch.prompt_logprobs
                rest, logits = logits[count:], logits[:count]
                launch.prompt_logprob_values = self.sampler.prompt_logprobs(rest, targets, top)
            elif logits.shape[0] > count:  # (another rank's, whose prompt rows are not read)
                logits = logits[:count]
            if count == 0:
                tokens = torch.zeros(0, dtype=torch.int32)
            elif launch.sampled_in_graph:
                tokens = launch.runner.tokens(launch.shape, count)
            else:
                tokens = self.sampler.sample(logits, launch.sampling)
                rows, cols = launch.targets
                self.table.token_pool[rows, cols] = tokens
            if launch.logprobs is not None and count:
                launch.logprob_values = self.sampler.logprobs(logits, tokens, *launch.logprobs)
            if self.device.type == "cuda" and count:
                # NOTE: pinned buffers in turn: a step's tokens are read at most a step later
                host = self._token_host[launch.index % len(self._token_host)][:count]
                host.copy_(tokens, non_blocking=True)
                tokens = host
                launch.done = launch.timer.stopped
            if self.ctx.routing is not None:
                launch.routing = self._routing_to_host(self.ctx.routing)
            launch.timer.stop()  # behind the tokens' (and the routing's) copy to the host
            launch.tokens = tokens
        except Exception:
            self._check_ranks_alive()
            raise

    def _routing_to_host(self, routing: torch.Tensor) -> torch.Tensor:
        """The step's expert counts, copied (enqueued, on a GPU) to a host tensor of its own."""
        # NOTE: done whatever the record level (the engine does not know it): one copy of
        # MoE layers x experts int32 (24 KiB for 48 x 128) per step (`to_host`). Not a ring like
        # the tokens': a record completed late (its `rows` read long after its step) must still
        # find its own counts. On the CPU a copy: the counts' buffer is reused.
        return routing.clone() if routing.device.type != "cuda" else to_host(routing)

    def _check_ranks_alive(self) -> None:
        if self.ranks is not None:
            self.ranks.check(wait_s=2.0)

    def wait(self, launch: Launch) -> None:
        """Until the batch's tokens are on the host (with other ranks, watching them)."""
        if launch.done is None:
            return
        if self.ranks is None:
            launch.done.synchronize()
        else:
            self.ranks.wait(launch.done)

    def rank_device_ms(self) -> dict[int, list[float]]:
        """Launch -> device ms on ranks 1.. of the steps not asked about before."""
        return {} if self.ranks is None else self.ranks.device_ms()

    def rank_events(self) -> dict[int, list[list[tuple]]]:
        """Launch -> the profiler events of ranks 1.. since the last call, on their clocks."""
        return {} if self.ranks is None else self.ranks.events()

    def check_ranks(self) -> None:
        """Raise unless every rank's request table equals rank 0's."""
        differ = [] if self.ranks is None else self.ranks.same_tables(self.table)
        if differ:
            raise AssertionError(
                f"tensor-parallel ranks {differ} hold a request table unlike rank 0's"
            )


@functools.cache
def collect_start_up() -> None:
    """A full collection at a process's first engine: its start-up objects (the imports, the
    first model) made long-lived at once, so that no full collection of them falls inside a run.
    Once: a later engine adds few such objects, and a full collection is slow where a process
    holds many (a notebook, the tests; docs/performance.md)."""
    gc.collect()


def give_back(exc: BaseException, device: torch.device) -> None:
    """The memory of an engine whose build raised `exc`: its half-built parts (weights, pool,
    graphs) are held by the locals of the frames its traceback keeps (a notebook keeps the last
    error, pytest every failure's), so a next engine would find the GPU full. The frames keep
    their lines, not their locals."""
    traceback.clear_frames(exc.__traceback__)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _prompt_targets(batch: Batch, counts: np.ndarray) -> tuple[np.ndarray, int]:
    """The prompt tokens whose log probabilities the step's extra rows give (each row's next
    prompt token), and the most top tokens a request of them asks for."""
    cached = batch.ledger[1]
    asking = [(r, c, n) for r, c, n in zip(batch.reqs, cached.tolist(), counts.tolist()) if n]
    targets = np.concatenate([np.asarray(r.prompt_ids[c + 1 : c + 1 + n]) for r, c, n in asking])
    return targets.astype(np.int64), max(r.sampling.prompt_logprobs for r, _, _ in asking)


@dataclass(slots=True, eq=False)
class Launch:
    """One batch as the engine runs it, from `Engine.prepare` (which decides how) to `wait`."""

    batch: Batch
    runner: GraphRunner | None
    shape: Shape | None  # the graph it replays (or runs padded, eagerly); None: eager
    prompt_ids: np.ndarray | None
    tp_size: int = 1
    padded_rows: int = 0
    padded_tokens: int = 0
    cuda_graph: bool = False
    sampling: SamplingArgs | None = None  # None: nothing sampled, or by the graph
    sampled_in_graph: bool = False
    targets: tuple[torch.Tensor, torch.Tensor] | None = None  # token pool rows and columns
    index: int = 0  # the engine's count of steps before it (the same on every rank)
    timer: DeviceTimer | None = None
    tokens: torch.Tensor | None = None  # int32 [sampled requests] on the host
    # the sampled rows that report log probabilities and how many top tokens (`Sampler.
    # logprob_rows`); after `sample`, theirs on the host (`Sampler.logprobs`)
    logprobs: tuple[np.ndarray, int] | None = None
    logprob_values: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # a prompt step's prompt tokens whose log probabilities it computes, after the positions
    # before them, how many top tokens (`_prompt_targets`) and how many of them each request
    # has; after `sample`, theirs on the host (`Sampler.prompt_logprobs`)
    prompt_logprobs: tuple[np.ndarray, int, np.ndarray] | None = None
    prompt_logprob_values: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    done: torch.cuda.Event | None = None  # after their copy (None: nothing to wait for)
    moe_layers: tuple[int, ...] = ()  # the decoder layers with an MoE block (none: dense)
    # int32 [MoE layers, experts] on the host, after `sample`: tokens each expert received
    # (a graph's padding not counted); None for a dense model. Read it with `host_routing`.
    routing: torch.Tensor | None = None

    def host_routing(self) -> np.ndarray | None:
        """The step's expert counts (int32 [MoE layers, experts]) once on the host; None for a
        dense model. Waits for the step's end, which is behind their copy."""
        if self.routing is None:
            return None
        if self.timer is not None:
            self.timer.elapsed_ms()  # NOTE: synchronizes with the timer's stop, after the copy
        return self.routing.numpy()

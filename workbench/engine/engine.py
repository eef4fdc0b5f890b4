"""The Engine: model, KV pool, tables and attention backend on one device; forwards one batch."""

from __future__ import annotations

import torch

from ..attention import create_backend
from ..config import EngineConfig
from ..core import Batch
from ..kvcache.pool import KVPool
from ..models import ModelConfig, resolve
from ..models.weights import build_model
from ..scheduler.table import TableManager
from .context import ForwardContext
from .sampler import Sampler


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device, self.dtype = config.torch_device, config.torch_dtype
        self.model_dir = resolve(config.model)
        self.model_config = cfg = ModelConfig.from_dir(self.model_dir)
        self.max_seq_len = config.max_seq_len or min(
            cfg.max_position_embeddings, config.max_seq_len_cap
        )
        self.model = build_model(
            cfg, self.max_seq_len, self.device, self.dtype, self.model_dir, seed=config.seed
        )
        self.num_pages = config.num_pages or self._pages_from_memory()
        self.pool = KVPool(
            cfg.num_layers,
            self.num_pages,
            config.page_size,
            cfg.num_kv_heads,
            cfg.head_dim,
            self.dtype,
            self.device,
        )
        self.table = TableManager(config.max_running_reqs, self.max_seq_len, self.device)
        self.backend = create_backend(
            config.attention_backend,
            pool=self.pool,
            table=self.table,
            num_heads=cfg.num_heads,
            head_dim=cfg.head_dim,
        )
        self.ctx = ForwardContext(self.backend)
        self.sampler = Sampler(cfg.vocab_size, self.device, config.seed)

    def _pages_from_memory(self) -> int:
        per_token = self.model_config.kv_bytes_per_token(self.dtype.itemsize)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = free * 0.9
        else:
            budget = self.config.kv_memory_gb * 2**30
        pages = int(budget // (per_token * self.config.page_size))
        if pages < 1:
            raise ValueError("no memory left for the KV cache after loading the model")
        return pages

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [sampled requests, vocab] in float32."""
        self.ctx.batch = batch
        try:
            return self.model(batch.input_ids, batch.positions, self.ctx, batch.sample_idx)
        finally:
            self.ctx.batch = None

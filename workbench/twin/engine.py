"""The twin's engine: the recorded engine's request table, page table, KV pool and graph
shapes, and no model. `forward` puts the step's predicted time on the `Timeline` (an MoE
model's step routed as `routing.py` estimates); `sample` gives every sampled request a token
that is never EOS, so each runs to its `max_tokens`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..config import EngineConfig
from ..core import Batch
from ..distributed import SINGLE
from ..engine.engine import Launch
from ..engine.graph import GraphShapes
from ..history.routing import experts_touched
from ..kvcache.table import TableManager
from ..models import ModelConfig, resolve
from .costs import StepCosts
from .features import batch_features
from .routing import estimated_routing
from .timeline import Timeline


class TwinEngine:
    def __init__(self, config: EngineConfig, costs: StepCosts, timeline: Timeline) -> None:
        self.config, self.costs, self.timeline = config, costs, timeline
        meta = costs.meta
        self.model_dir = resolve(config.model)
        self.model_config = model_cfg = ModelConfig.from_dir(self.model_dir)
        self.dtype = config.torch_dtype
        self.device = torch.device("cpu")  # its tables; the device it stands for: `simulates`
        self.simulates = f"{meta['device_name']} ({meta['device']})"
        self.kernels = meta.get("kernels")  # the runs', where they said (`Engine.kernels`)
        self.ranks, self.tp, self.launches = None, SINGLE, 0
        self.num_devices = int(meta["tp_size"])
        self.max_seq_len = config.max_seq_len or min(
            model_cfg.max_position_embeddings, config.max_seq_len_cap
        )
        self.num_pages = config.num_pages or _recorded_pages(meta, config.page_size)
        width = -(-self.max_seq_len // config.page_size) * config.page_size
        self.table = TableManager(config.max_running_reqs, width, self.device)
        dummy_slot = self.num_pages * config.page_size
        self.table.write_row(self.table.dummy_row, 0, np.full(width, dummy_slot, np.int32))
        self.table.sync_device()
        # NOTE: padded as the recorded engine pads (on a GPU); prompt steps run as graphs only
        # when the recorded runs fitted such costs
        gpu = str(meta["device"]).startswith("cuda")
        max_bs = min(config.cuda_graph_max_bs, config.max_running_reqs) if gpu else 0
        prompt = gpu and "prompt_graph" in costs.device
        max_tokens = config.cuda_graph_max_tokens if prompt else 0
        self.padding = GraphShapes(max_bs, max_tokens, config.max_running_reqs, width)
        self.captures_graphs = gpu and config.cuda_graph
        self._token = next(t for t in range(100, model_cfg.vocab_size) if t not in _eos(model_cfg))
        self.moe_layers: tuple[int, ...] = tuple(model_cfg.moe_layers) if model_cfg.is_moe else ()

    def prepare(self, batch: Batch) -> Launch:
        """The batch padded as the real engine's graph runners would pad it, or eager."""
        launch = Launch(batch, None, None, None, moe_layers=self.moe_layers)
        _, cached, device_len = batch.ledger
        tokens = int((device_len - cached).sum())
        launch.padded_rows, launch.padded_tokens = batch.size, tokens
        shape = self.padding.of(batch)
        if shape is not None:
            launch.padded_rows, launch.padded_tokens = shape.rows, shape.tokens
            launch.cuda_graph, launch.shape = self.captures_graphs, shape
        return launch

    def forward(self, launch: Launch) -> None:
        batch = launch.batch
        graph = launch.shape is not None and self.captures_graphs
        launch.index, self.launches = self.launches, self.launches + 1
        experts = 0.0
        if self.moe_layers:  # NOTE: an estimate from the step's tokens alone (`routing.py`)
            cfg = self.model_config
            _, cached, device_len = batch.ledger
            nd = batch.num_decode
            counts = estimated_routing(
                nd,
                batch.size - nd,
                int((device_len[nd:] - cached[nd:]).sum()),
                len(self.moe_layers),
                cfg.num_experts,
                cfg.num_experts_per_tok,
                launch.index,
                self.costs.prompt_spread,
            )
            launch.routing = torch.from_numpy(counts)
            experts = experts_touched(counts)
        features = batch_features(batch, launch.padded_rows, launch.padded_tokens, graph, experts)
        device_ms, host_ms = self.costs.predict(features)
        predicted = self.timeline.launch(device_ms, host_ms)
        self.timeline.pending[id(batch)] = predicted  # the probe reads it at collect, record
        launch.timer, launch.done = SimTimer(device_ms), predicted.done

    def sample(self, launch: Launch, logits: None) -> None:
        launch.tokens = np.full(len(launch.batch.sampled_reqs), self._token, dtype=np.int32)

    def wait(self, launch: Launch) -> None:
        self.timeline.wait_for(launch.done)

    def rank_device_ms(self) -> dict[int, list[float]]:
        return {}

    def check_ranks(self) -> None:
        """One process: nothing to compare."""

    def close(self) -> None:
        self.table = None
        self.timeline.pending.clear()


class SimTimer:
    """A device timer that reads a predicted time."""

    cuda = True  # a prediction of the recorded device, not the host's wall time

    def __init__(self, ms: float) -> None:
        self._ms = ms

    def elapsed_ms(self) -> float:
        return self._ms


def _recorded_pages(meta: dict, page_size: int) -> int:
    if not meta.get("num_pages") or not meta.get("page_size"):
        raise ValueError("the step costs do not say the recorded KV pool's size: give num_pages")
    return max(1, math.floor(meta["num_pages"] * meta["page_size"] / page_size))


def _eos(model_cfg: ModelConfig) -> frozenset[int]:
    return frozenset(model_cfg.eos_token_ids)

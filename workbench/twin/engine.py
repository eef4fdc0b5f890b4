"""The twin's engine: the real request table, page table and KV accounting of the recorded
engine, and no model. Its `run_batch` moves every request's ledger as a forward would and
predicts the step's time on the `Timeline` instead of running it.

What it keeps of the engine it stands for (`Engine`): the model's config (context length, EOS
ids, KV bytes), the KV pool's size (`num_pages`: given, or as many KV tokens as the recorded
engine had), the request slots, and which steps run padded as CUDA graphs: the decode steps of a
GPU engine up to `cuda_graph_max_bs`, and its prefill and mixed steps up to
`cuda_graph_max_tokens` when the recorded runs had such graphs (runs of an engine that ran those
steps eagerly fitted costs of eager prompt steps only: the twin then runs them eagerly too),
padded to the same shapes. Every request gets a token that is never EOS, so it runs to its
`max_tokens`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..config import EngineConfig
from ..core import Batch, Req
from ..distributed import SINGLE
from ..engine.engine import DeviceStep
from ..engine.graph import capture_sizes
from ..engine.prefill_graph import graph_shapes, shape_for
from ..engine.ranks import OneRank
from ..kvcache.table import TableManager
from ..models import ModelConfig, resolve
from ..stages import StageClock
from .costs import StepCosts
from .features import batch_features
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
        self.ranks, self.tp, self.launches = OneRank(), SINGLE, 0
        self.num_devices = int(meta["tp_size"])
        self.max_seq_len = config.max_seq_len or min(
            model_cfg.max_position_embeddings, config.max_seq_len_cap
        )
        self.num_pages = config.num_pages or _recorded_pages(meta, config.page_size)
        width = -(-self.max_seq_len // config.page_size) * config.page_size
        self.table = TableManager(config.max_running_reqs, width, self.device)
        dummy_slot = self.num_pages * config.page_size
        self.table.write_row(self.table.dummy_row, 0, np.full(width, dummy_slot, np.int32))
        # a GPU engine runs decode steps padded to its graphs' sizes
        self._sizes, self._shapes = None, []
        if str(meta["device"]).startswith("cuda"):
            self._sizes = capture_sizes(min(config.cuda_graph_max_bs, config.max_running_reqs))
            if config.cuda_graph_max_tokens and "prompt_graph" in costs.device:
                rows = config.max_running_reqs
                self._shapes = graph_shapes(config.cuda_graph_max_tokens, rows, width)
        self.captures_graphs = self._sizes is not None and config.cuda_graph
        self._last: tuple[Batch | None, tuple[int, int] | None] = (None, None)
        self._token = next(t for t in range(100, model_cfg.vocab_size) if t not in _eos(model_cfg))

    def _prompt_shape(self, batch: Batch) -> tuple[int, int] | None:
        """As the real engine's `PrefillGraphRunner.shape`: from the tokens as launched."""
        if not batch.is_prefill or not self._shapes:
            return None
        if self._last[0] is not batch:
            tokens = sum(r.extend_len for r in batch.reqs)
            self._last = (batch, shape_for(self._shapes, tokens, batch.size))
        return self._last[1]

    def uses_graph(self, batch: Batch) -> bool:
        if batch.phase == "decode":
            return self._sizes is not None and batch.size <= self._sizes[-1]
        return self._prompt_shape(batch) is not None

    def padded_size(self, batch: Batch) -> int:
        if not self.uses_graph(batch):
            return batch.size
        if batch.phase != "decode":
            return self._prompt_shape(batch)[1]
        return next(s for s in self._sizes if s >= batch.size)

    def padded_tokens(self, batch: Batch) -> int:
        shape = self._prompt_shape(batch)
        if shape is not None:
            return shape[0]
        _, cached, device_len = batch.ledger
        return int((device_len - cached).sum()) + self.padded_size(batch) - batch.size

    def fill_inputs(self, batch: Batch) -> None:
        """Nothing to build: no forward runs (the page table is written, as for a real one)."""

    def plan(self, batch: Batch) -> None:
        """No attention to plan."""

    def run_batch(self, batch: Batch, clock: StageClock | None = None) -> DeviceStep:
        """The step on the timeline: its predicted host and device times; every request's
        ledger moved past it, a token for each sampled one."""
        graph = self.uses_graph(batch) and self.captures_graphs
        rows, tokens = self.padded_size(batch), self.padded_tokens(batch)
        features = batch_features(batch, rows, tokens, graph)
        device_ms, host_ms = self.costs.predict(features)
        predicted = self.timeline.launch(device_ms, host_ms)
        self.timeline.pending[id(batch)] = predicted  # the probe reads it at collect, record
        launch, self.launches = self.launches, self.launches + 1
        Req.complete_all(batch.reqs)
        tokens = np.full(len(batch.sampled_reqs), self._token, dtype=np.int32)
        return DeviceStep(tokens, predicted.done, SimTimer(device_ms), 1, launch)

    def wait(self, step: DeviceStep) -> None:
        self.timeline.wait_for(step.done)

    def rank_device_ms(self) -> dict[int, list[float]]:
        return {}

    def check_ranks(self) -> None:
        """One process: nothing to compare."""

    def close(self) -> None:
        self.table = None
        self.timeline.pending.clear()


class SimTimer:
    """A device timer that reads a predicted time."""

    def __init__(self, ms: float) -> None:
        self._ms = ms

    def elapsed_ms(self) -> float:
        return self._ms


def _recorded_pages(meta: dict, page_size: int) -> int:
    """As many KV tokens as the recorded engine had, in pages of `page_size`."""
    if not meta.get("num_pages") or not meta.get("page_size"):
        raise ValueError("the step costs do not say the recorded KV pool's size: give num_pages")
    return max(1, math.floor(meta["num_pages"] * meta["page_size"] / page_size))


def _eos(model_cfg: ModelConfig) -> frozenset[int]:
    return frozenset(model_cfg.eos_token_ids)

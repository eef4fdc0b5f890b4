"""Sampling: greedy, temperature, top-k, top-p, and a per-request seed.

Sampling draws ``argmax(p / E)`` with ``E ~ Exp(1)`` per token (the exponential race, an exact draw
from ``p``), computed as ``argmax(logits / T - log E)``: the same draw without the softmax (the log
of the normaliser is the same for every token of a row). A seeded request's noise comes from its
own generator keyed by (seed, output index), so its tokens do not depend on what else shares the
batch. With `fused_sampling` on a GPU (the default where Triton is installed), batches without
top-k or top-p use the one-pass kernel of `kernels/sampling.py` instead: the same race with Philox
noise keyed per row by (seed, output index), or by (engine seed, call, row) when unseeded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core import Req
from ..device import to_device


@dataclass
class SamplingArgs:
    all_greedy: bool
    greedy: torch.Tensor | None = None  # [batch] bool; None if no row is greedy
    temperatures: torch.Tensor | None = None  # [batch], 1 where greedy
    top_k: torch.Tensor | None = None  # [batch] int64, vocab size where off; None if all off
    top_p: torch.Tensor | None = None  # [batch]; None if all off
    seeded: list[tuple[int, int]] | None = None  # (row, generator key)
    keys: torch.Tensor | None = None  # [batch] Philox keys; set when the fused kernel samples


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, seed: int, fused: bool = False):
        self.vocab_size, self.device = vocab_size, device
        self.seed = seed
        self.generator = torch.Generator(device).manual_seed(seed)
        self.fused = fused  # the one-pass Triton kernel, for batches without top-k / top-p
        self._calls = 0  # sample calls: keys the unseeded rows' noise in the fused kernel

    def prepare(self, reqs: list[Req]) -> SamplingArgs:
        params = [r.sampling for r in reqs]
        if all(p.is_greedy for p in params):
            return SamplingArgs(all_greedy=True)
        dev = self.device
        greedy = [p.is_greedy for p in params]
        top_k = any(p.top_k > 0 for p in params)
        top_p = any(p.top_p < 1.0 for p in params)
        if self.fused and not top_k and not top_p:
            return self._prepare_fused(reqs, greedy)
        args = SamplingArgs(
            all_greedy=False,
            greedy=to_device(greedy, dev, torch.bool) if any(greedy) else None,
            temperatures=to_device(
                [1.0 if p.is_greedy else p.temperature for p in params], dev, torch.float32
            ),
        )
        if top_k:
            ks = [p.top_k if p.top_k > 0 else self.vocab_size for p in params]
            args.top_k = to_device(ks, dev)
        if top_p:
            args.top_p = to_device([p.top_p for p in params], dev, torch.float32)
        # NOTE: keyed by the index of the token being sampled, which the device side knows
        # (device_len was advanced by complete_one), so it also holds under overlap scheduling.
        args.seeded = [
            (i, _mix(r.sampling.seed, r.device_len - 1 - r.prompt_len))
            for i, r in enumerate(reqs)
            if r.sampling.seed is not None and not r.sampling.is_greedy
        ]
        return args

    def _prepare_fused(self, reqs: list[Req], greedy: list[bool]) -> SamplingArgs:
        """Temperatures with 0 for greedy rows, and one Philox key per row."""
        self._calls += 1
        n = len(reqs)
        seeds = np.full(n, self.seed % 2**64, dtype=np.uint64)
        # NOTE: the top bit keeps an unseeded row's counter apart from any output index.
        first = np.uint64(1 << 63 | self._calls << 20)
        counters = first + np.arange(n, dtype=np.uint64)
        for i, r in enumerate(reqs):
            if r.sampling.seed is not None:
                seeds[i] = r.sampling.seed % 2**64
                counters[i] = r.device_len - 1 - r.prompt_len
        temperatures = [0.0 if g else r.sampling.temperature for r, g in zip(reqs, greedy)]
        return SamplingArgs(
            all_greedy=False,
            temperatures=to_device(temperatures, self.device, torch.float32),
            keys=to_device(philox_keys(seeds, counters), self.device),
        )

    def sample(self, logits: torch.Tensor, args: SamplingArgs) -> torch.Tensor:
        """logits: [batch, vocab] (float32 on the CPU, the model's dtype on a GPU) -> token ids
        [batch] int32."""
        if args.all_greedy:
            return logits.argmax(-1).to(torch.int32)
        if args.keys is not None:
            from ..kernels.sampling import race_sample

            return race_sample(logits, args.temperatures, args.keys).to(torch.int32)
        # a mixed batch: greedy rows take the plain argmax
        greedy = None if args.greedy is None else logits.argmax(-1)
        logits = logits / args.temperatures[:, None]  # float32 (a new tensor)
        sampled = self._exponential_race(logits, args)
        if greedy is not None:
            sampled = torch.where(args.greedy, greedy, sampled)
        return sampled.to(torch.int32)

    def _exponential_race(self, logits: torch.Tensor, args: SamplingArgs) -> torch.Tensor:
        """argmax(logits - log E): `logits` already divided by the temperatures (and owned)."""
        if args.top_k is not None or args.top_p is not None:
            logits = _mask_top_k_top_p(logits, args.top_k, args.top_p)
        noise = _exponential(logits.shape, self.generator, logits.device)
        for row, key in args.seeded:
            gen = torch.Generator(logits.device).manual_seed(key)
            noise[row] = _exponential(logits.shape[1:], gen, logits.device)
        return logits.sub_(noise.log_()).argmax(-1)


def _mask_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        drop |= rank >= top_k[:, None]
    if top_p is not None:
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        # keep the smallest head of the distribution whose mass reaches top_p (at least one token)
        drop |= (probs.cumsum(-1) - probs) >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def _mix(seed: int, index: int) -> int:
    return (seed * 0x9E3779B1 + index * 0x85EBCA77 + 1) % (2**63 - 1)


def _exponential(shape, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Exp(1) noise: one kernel on a GPU; on a CPU -log(U) is about 4x faster than exponential_."""
    if device.type == "cuda":
        return torch.empty(shape, device=device).exponential_(generator=generator)
    return torch.rand(shape, generator=generator, device=device).log_().neg_()


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def philox_keys(seeds: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """63-bit keys from (seed, counter) pairs: splitmix64 of their combination, vectorised."""
    with np.errstate(over="ignore"):
        x = seeds.astype(np.uint64) * _GOLDEN + counters.astype(np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(1)).astype(np.int64)

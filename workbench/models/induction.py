"""Seeded weights with two planted attention circuits: a model whose greedy output is known.

Random weights give near-tied logits, so comparing two engines' tokens proves little. Here the
logits are peaked and still depend on the whole context through the KV cache: layer 0's
previous-token heads copy each token into a second subspace (fastest RoPE pairs), and layer 1's
induction heads match the current token against it (slowest pairs) and copy the token that
followed. After ``A B C D A B`` greedy decoding continues ``C D ...``."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import NamedTuple

import torch

from .decoder import Decoder, full_shapes

PREV_PAIRS = 12
MATCH_PAIRS = 16
NORM_GAIN = 5.0  # q/k norm weight on the pairs used
COPY_GAIN = 3.0  # the copied token against the current one, in the residual stream


def planted_layout(hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Width of the token subspace (whole KV heads); raises if the shapes leave no room."""
    if head_dim < 2 * (PREV_PAIRS + MATCH_PAIRS):
        raise ValueError(f"the induction init needs head_dim >= 56, got {head_dim}")
    if heads % kv_heads:
        raise ValueError(f"the induction init needs whole GQA groups, got {heads}/{kv_heads}")
    copy_heads = min(kv_heads, (hidden - 1) // (2 * head_dim))
    if copy_heads < 1:
        raise ValueError(
            f"the induction init needs hidden_size >= 2 * head_dim + 1, got {hidden} "
            f"for head_dim {head_dim}"
        )
    return copy_heads * head_dim


@torch.no_grad()
def init_induction(model: Decoder, seed: int) -> None:
    """Fill `model` with the planted weights, built whole in float32 on the CPU so that a seed
    gives the same model on any device, dtype and TP size."""
    model_cfg = model.model_cfg
    _check_induction(model_cfg)
    shape = _Shape.of(model_cfg)
    gen = torch.Generator().manual_seed(seed)
    params = {name: torch.zeros(s) for name, s in full_shapes(model_cfg).items()}
    _plant_base(params, shape, gen)
    inv_freq = model_cfg.rope_theta ** (
        -torch.arange(0, shape.hd, 2, dtype=torch.float64) / shape.hd
    )
    _plant_previous_token_heads(params, shape, inv_freq)
    _plant_induction_heads(params, shape, gen)
    for name, _ in model.named_parameters():
        model.load_param(name, params[name])


# a mixture of experts plants the same circuits: its routers and experts are the small noise a
# dense model's MLPs are, so its answers are known while every token is routed
PLANTABLE = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def _check_induction(model_cfg) -> None:
    if model_cfg.architecture not in PLANTABLE or not model_cfg.tie_word_embeddings:
        raise ValueError("the induction init needs a Qwen3 model with tied embeddings")
    if model_cfg.rope_scaling is not None:  # the planted scores assume RoPE's plain frequencies
        raise ValueError("the induction init needs RoPE without scaling")
    if model_cfg.num_layers < 2:
        raise ValueError("the induction init needs at least 2 layers")


class _Shape(NamedTuple):
    """The model's sizes and the planted residual layout: the token's subspace (`main`, `m`
    wide), the previous token's (`prev`) and a constant dimension (`const`)."""

    d: int
    hd: int
    nh: int
    nkv: int
    m: int
    main: torch.Tensor
    prev: torch.Tensor
    const: int

    @classmethod
    def of(cls, model_cfg) -> _Shape:
        d, hd = model_cfg.hidden_size, model_cfg.head_dim
        nh, nkv = model_cfg.num_heads, model_cfg.num_kv_heads
        m = planted_layout(d, nh, nkv, hd)
        return cls(d, hd, nh, nkv, m, torch.arange(m), torch.arange(m, 2 * m), 2 * m)

    @property
    def group(self) -> int:
        return self.nh // self.nkv

    @property
    def half(self) -> int:
        return self.hd // 2


def _plant_base(params: dict, shape: _Shape, gen: torch.Generator) -> None:
    emb = params["embed_tokens.weight"]
    emb[:, shape.main] = torch.randn(emb.shape[0], shape.m, generator=gen)
    emb[:, shape.const] = 1.0
    planted = ("layers.0.self_attn.", "layers.1.self_attn.")
    for name in params:
        if name.startswith(planted):
            continue  # set below; what is not set stays zero
        if name.endswith("norm.weight"):
            params[name].fill_(1.0)
        elif name != "embed_tokens.weight":
            params[name].normal_(0.0, 0.02, generator=gen)


def _plant_previous_token_heads(params: dict, shape: _Shape, inv_freq: torch.Tensor) -> None:
    hd, nh, nkv, m, half = shape.hd, shape.nh, shape.nkv, shape.m, shape.half
    q_rows, kv_rows = nh * hd, nkv * hd
    rms0 = math.sqrt((m + 1) / shape.d)  # the embedding's rms (token subspace and constant)
    fast = torch.arange(PREV_PAIRS)
    a = "layers.0.self_attn."
    qkv, o = params[a + "qkv_proj.weight"], params[a + "o_proj.weight"]
    for h in range(nh):
        qkv[h * hd + fast, shape.const] = 1.0
    angle = inv_freq[fast].float()
    for g in range(nkv):
        rows = q_rows + g * hd
        qkv[rows + fast, shape.const] = angle.cos()
        qkv[rows + half + fast, shape.const] = angle.sin()
    params[a + "q_norm.weight"][fast] = NORM_GAIN
    params[a + "k_norm.weight"][torch.cat([fast, fast + half])] = NORM_GAIN
    for g in range(m // hd):
        dims = torch.arange(g * hd, (g + 1) * hd)
        qkv[q_rows + kv_rows + dims, dims] = 1.0
        o[shape.prev[dims], g * shape.group * hd + torch.arange(hd)] = rms0


def _plant_induction_heads(params: dict, shape: _Shape, gen: torch.Generator) -> None:
    hd, nh, nkv, m, half, group = shape.hd, shape.nh, shape.nkv, shape.m, shape.half, shape.group
    q_rows, kv_rows = nh * hd, nkv * hd
    rms1 = math.sqrt((2 * m + 1) / shape.d)  # plus the previous token, copied by layer 0
    slow = torch.arange(half - MATCH_PAIRS, half)
    slow_dims = torch.cat([slow, slow + half])
    a = "layers.1.self_attn."
    qkv, o = params[a + "qkv_proj.weight"], params[a + "o_proj.weight"]
    for g in range(nkv):
        proj = torch.randn(2 * MATCH_PAIRS, m, generator=gen)
        for h in range(g * group, (g + 1) * group):
            qkv[(h * hd + slow_dims)[:, None], shape.main] = proj
        qkv[(q_rows + g * hd + slow_dims)[:, None], shape.prev] = proj
    params[a + "q_norm.weight"][slow_dims] = NORM_GAIN
    params[a + "k_norm.weight"][slow_dims] = NORM_GAIN
    for g in range(m // hd):
        dims = torch.arange(g * hd, (g + 1) * hd)
        qkv[q_rows + kv_rows + dims, dims] = 1.0
        o[dims, g * group * hd + torch.arange(hd)] = COPY_GAIN * rms1


def pattern_continuation(prompt: list[int], n: int) -> list[int]:
    """The `n` tokens the planted model answers greedily: each the token that followed the
    earlier occurrences of the last one. Raises ValueError where the construction fixes no answer:
    a last token not seen before or followed by different tokens, or a first token that occurs
    again (layer 0 copies position 0's own token, which has no previous one)."""
    seq = list(prompt)
    if seq[0] in seq[1:]:
        raise ValueError("the first token of the prompt occurs again")
    for _ in range(n):
        followers = {seq[i + 1] for i in range(len(seq) - 1) if seq[i] == seq[-1]}
        if len(followers) != 1:
            raise ValueError(
                f"token {seq[-1]} at position {len(seq) - 1} is followed by "
                f"{sorted(followers) or 'nothing'} earlier: no single answer"
            )
        seq.append(followers.pop())
    return seq[len(prompt) :]


def pattern_prompts(
    rng: random.Random, lengths: Sequence[int], period: int, header_len: int = 4
) -> list[list[int]]:
    """Prompts of the given lengths that the planted model answers decisively: a header of
    distinct tokens, then a pattern of `period` distinct tokens repeated; each is a prefix of the
    longest, as requests sharing a document are. Ids avoid special tokens."""
    if min(lengths) < header_len + period + 1:
        raise ValueError(
            f"each length must be at least {header_len + period + 1} (header {header_len}, "
            f"period {period}, and one more token so the last one occurred before)"
        )
    tokens = rng.sample(range(1000, 150000), header_len + period)
    header, pattern = tokens[:header_len], tokens[header_len:]
    body = pattern * -(-max(lengths) // period)
    return [header + body[: n - header_len] for n in lengths]

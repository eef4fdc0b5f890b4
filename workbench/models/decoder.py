"""One decoder for Llama (SmolLM2), Qwen2 (attention bias), Qwen3 (q/k norm) and the mixtures of
experts Qwen3-MoE (Qwen3's attention, sparse MoE blocks in `moe_layers`, dense MLPs elsewhere)
and Mixtral (Llama's attention, every layer an MoE block).

The forward takes a flat batch: every token of every request on one axis, with its absolute
position; attention reads each request's earlier tokens from the KV pool through the context."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..distributed import SINGLE, TPGroup
from ..layers.attention import AttentionLayer
from ..layers.embedding import LMHead, VocabParallelEmbedding
from ..layers.mlp import GatedMLP
from ..layers.moe import SparseMoE
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary
from .config import ModelConfig

if TYPE_CHECKING:
    from ..attention.context import ForwardContext


def check_tp_size(model_cfg: ModelConfig, tp_size: int) -> None:
    """Refuse a TP size that would split a head, a GQA group or the MLP unevenly."""
    allowed, m = model_cfg.tp_sizes, model_cfg
    if tp_size in allowed:
        return
    sizes = {"num_heads": m.num_heads, "num_kv_heads": m.num_kv_heads}
    if m.dense_layer_count:
        sizes["intermediate_size"] = m.intermediate_size
    if m.is_moe:
        sizes["moe_intermediate_size"] = m.moe_intermediate_size
    failing = [f"{name}={n}" for name, n in sizes.items() if n % tp_size]
    raise ValueError(
        f"tp_size={tp_size} would split the model unevenly: {', '.join(failing)} "
        f"(a rank holds whole heads and GQA groups); allowed tp_size values: {allowed}"
    )


def check_context(model_cfg: ModelConfig, max_positions: int) -> None:
    """Refuse a sliding window shorter than the context: attention here reads every earlier key."""
    window = model_cfg.sliding_window
    if window is not None and window < max_positions:
        raise ValueError(
            f"{model_cfg.architecture} has sliding_window={window}, shorter than the context "
            f"of {max_positions} tokens; sliding-window attention is not supported: pass "
            f"max_seq_len={window} or less (each token then sees its whole context)"
        )


class DecoderLayer(nn.Module):
    def __init__(self, model_cfg: ModelConfig, layer_id: int, rotary: Rotary, tp: TPGroup) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(model_cfg.hidden_size, model_cfg.rms_norm_eps)
        self.self_attn = AttentionLayer(
            layer_id,
            model_cfg.hidden_size,
            model_cfg.num_heads,
            model_cfg.num_kv_heads,
            model_cfg.head_dim,
            rotary,
            qkv_bias=model_cfg.qkv_bias,
            qk_norm_eps=model_cfg.rms_norm_eps if model_cfg.qk_norm else None,
            tp=tp,
        )
        self.post_attention_layernorm = RMSNorm(model_cfg.hidden_size, model_cfg.rms_norm_eps)
        self.mlp: GatedMLP | SparseMoE
        if layer_id in model_cfg.moe_layers:
            self.mlp = SparseMoE(
                model_cfg.moe_layers.index(layer_id),
                model_cfg.hidden_size,
                model_cfg.num_experts,
                model_cfg.num_experts_per_tok,
                model_cfg.moe_intermediate_size,
                renormalize=model_cfg.norm_topk_prob,
                tp=tp,
            )
        else:
            self.mlp = GatedMLP(model_cfg.hidden_size, model_cfg.intermediate_size, tp=tp)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        ctx: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream travels beside the layer output, so each add can be fused into
        the norm after it; ``residual + x`` is the hidden state Hugging Face carries."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, ctx)
        x, residual = self.post_attention_layernorm(x, residual)
        if isinstance(self.mlp, SparseMoE):
            return self.mlp(x, ctx), residual
        return self.mlp(x), residual


class Decoder(nn.Module):
    def __init__(self, model_cfg: ModelConfig, max_positions: int, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        check_tp_size(model_cfg, tp.size)
        check_context(model_cfg, max_positions)
        self.model_cfg, self.tp = model_cfg, tp
        rotary = Rotary(
            model_cfg.head_dim, max_positions, model_cfg.rope_theta, model_cfg.rope_scaling
        )
        self.embed_tokens = VocabParallelEmbedding(model_cfg.vocab_size, model_cfg.hidden_size, tp)
        self.layers = nn.ModuleList(
            DecoderLayer(model_cfg, i, rotary, tp) for i in range(model_cfg.num_layers)
        )
        self.norm = RMSNorm(model_cfg.hidden_size, model_cfg.rms_norm_eps)
        tied = self.embed_tokens if model_cfg.tie_word_embeddings else None
        self.lm_head = LMHead(model_cfg.vocab_size, model_cfg.hidden_size, tied, tp)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: ForwardContext,
        sample_idx: torch.Tensor,
    ) -> torch.Tensor:
        """Logits of the rows `sample_idx`, in the model's dtype (samplers need no float32 copy)."""
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, ctx)
        if sample_idx.shape[0] == 0:
            # NOTE: fused kernels fail on zero rows, and a batch of prompt chunks samples nothing
            return x.new_empty((0, self.model_cfg.vocab_size))
        # the last add, norm and LM head are per position: only rows that sample need them
        x, _ = self.norm(x[sample_idx], residual[sample_idx])
        return self.lm_head(x)

    def use_fused_kernels(self, on: bool, rope: bool = False) -> None:
        """Switch norms, rope and SiLU-and-mul to FlashInfer's fused CUDA kernels (or back); `rope`:
        q/k norm, RoPE and the KV store in one Triton kernel instead (head sizes a power of two)."""
        d = self.model_cfg.head_dim
        rope = rope and d >= 16 and d & (d - 1) == 0
        for module in self.modules():
            if hasattr(module, "fused"):
                module.fused = on
            if hasattr(module, "fused_rope"):
                module.fused_rope = rope

    def use_small_gemm(self, on: bool) -> None:
        """Compute the linear layers of batches up to `kernels.small_gemm.MAX_ROWS` rows with the
        small-batch Triton kernel instead of cuBLAS (or back); the LM head stays on cuBLAS."""
        for module in self.layers.modules():
            if hasattr(module, "small_gemm"):
                module.small_gemm = on

    def use_pdl(self, on: bool) -> None:
        """Launch the layers' Triton kernels (the fused q/k norm, RoPE and KV store; the small-batch
        GEMM) with programmatic dependent launch (`kernels/pdl.py`), or not."""
        for module in self.layers.modules():
            if hasattr(module, "pdl"):
                module.pdl = on

    def use_moe_backend(self, name: str) -> None:
        """Compute the experts of every MoE block with backend `name` (`layers.moe.MOE_BACKENDS`:
        "torch" anywhere, "triton" on a GPU); a dense model ignores it."""
        for module in self.modules():
            if isinstance(module, SparseMoE):
                module.use_backend(name)

    @torch.no_grad()
    def load_param(self, name: str, full: torch.Tensor, part: int | None = None) -> None:
        """Fill parameter `name` (or `part` of a merged one) with this rank's share of `full`."""
        module_name, _, attr = name.rpartition(".")
        module = self.get_submodule(module_name)
        if hasattr(module, "load_shard"):
            module.load_shard(attr, full, part)
        else:  # replicated on every rank (norms)
            getattr(module, attr).copy_(full)


def full_shapes(model_cfg: ModelConfig) -> dict[str, torch.Size]:
    """Each parameter's shape on one rank (the whole model), without allocating it."""
    with torch.device("meta"):
        model = Decoder(model_cfg, max_positions=1)
    return {name: p.shape for name, p in model.named_parameters()}

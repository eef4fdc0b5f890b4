"""ModelConfig: the few facts of a Hugging Face `config.json` the decoder needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2
    qk_norm: bool  # Qwen3
    eos_token_ids: tuple[int, ...]
    # the config's "workbench_init": "normal" (seeded random) or "induction" (models/induction.py)
    dummy_init: str = "normal"
    # mixture of experts (Qwen3-MoE, Mixtral): a dense model keeps these defaults
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's gate / up width
    norm_topk_prob: bool = False  # the top-k router weights renormalised to sum to 1
    moe_layers: tuple[int, ...] = ()  # the decoder layers whose MLP is a sparse MoE block
    # keys each query attends back to (None: all); the decoder runs only None or the whole context
    sliding_window: int | None = None

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        arch = (raw.get("architectures") or ["?"])[0]
        if arch not in ARCHITECTURES:
            raise ValueError(f"unsupported architecture {arch!r}; supported: {ARCHITECTURES}")
        # transformers 5 keeps theta and scaling under rope_parameters, 4.x at the top level
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", None) or raw.get("rope_theta") or 10000.0
        if rope.get("rope_type", rope.get("type", "default")) == "default":
            rope = None
        elif "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope["type"]
        heads = raw["num_attention_heads"]
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=rope,
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            eos_token_ids=eos_ids,
            dummy_init=raw.get("workbench_init", "normal"),
            **_moe_fields(arch, raw),
        )

    @classmethod
    def from_dir(cls, path: Path) -> ModelConfig:
        raw = json.loads((Path(path) / "config.json").read_text())
        model_cfg = cls.from_dict(raw)
        gen = Path(path) / "generation_config.json"
        if gen.exists():  # generate() stops on generation_config's eos ids when present
            eos = json.loads(gen.read_text()).get("eos_token_id")
            if eos is not None:
                ids = tuple(eos) if isinstance(eos, list) else (eos,)
                model_cfg = cls(**{**model_cfg.__dict__, "eos_token_ids": ids})
        return model_cfg

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and bool(self.moe_layers)

    @property
    def dense_layer_count(self) -> int:
        """Decoder layers with a dense MLP of `intermediate_size` (every layer of a dense model)."""
        return self.num_layers - len(self.moe_layers)

    def expert_params(self) -> int:
        """The parameters of one expert of one MoE layer (gate, up and down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def num_params(self) -> int:
        """Every parameter, every expert included (not only those a token activates)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        qkv_rows = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        qkv = (h + (1 if self.qkv_bias else 0)) * qkv_rows  # weight, and bias when it has one
        o = self.num_heads * self.head_dim * h
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        per_layer = qkv + o + qk_norm + 2 * h  # and the two norms
        mlps = self.dense_layer_count * 3 * h * i
        # each MoE layer: its experts and its router
        experts = len(self.moe_layers) * self.num_experts * (self.expert_params() + h)
        head = 0 if self.tie_word_embeddings else v * h
        return self.num_layers * per_layer + mlps + experts + v * h + head + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @property
    def tp_sizes(self) -> list[int]:
        """The tensor-parallel sizes this model splits into evenly: each divides the query
        heads, the KV heads, the dense MLP and each expert's intermediate size (a rank never
        holds part of a head or a GQA group)."""
        counts = [self.num_heads, self.num_kv_heads]
        if self.dense_layer_count:
            counts.append(self.intermediate_size)
        if self.is_moe:
            counts.append(self.moe_intermediate_size)
        return [d for d in range(1, self.num_kv_heads + 1) if all(n % d == 0 for n in counts)]


def _moe_fields(arch: str, raw: dict) -> dict:
    """The MoE fields of a Qwen3-MoE or Mixtral config, with Hugging Face's defaults."""
    layers = raw["num_hidden_layers"]
    # NOTE: transformers 5 writes either family's expert count as num_local_experts
    experts = raw.get("num_experts", raw.get("num_local_experts"))
    if arch == "MixtralForCausalLM":  # every layer sparse; the router always renormalises
        fields = dict(
            num_experts=8 if experts is None else experts,
            num_experts_per_tok=raw.get("num_experts_per_tok", 2),
            moe_intermediate_size=raw["intermediate_size"],
            norm_topk_prob=True,
            moe_layers=tuple(range(layers)),
            sliding_window=raw.get("sliding_window"),
        )
    elif arch == "Qwen3MoeForCausalLM":
        experts = 128 if experts is None else experts
        step = raw.get("decoder_sparse_step", 1)
        dense = set(raw.get("mlp_only_layers") or ())
        sparse = experts > 0 and step > 0
        fields = dict(
            num_experts=experts,
            num_experts_per_tok=raw.get("num_experts_per_tok", 8),
            moe_intermediate_size=raw.get("moe_intermediate_size", 768),
            norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
            # as Hugging Face builds them: a layer not in mlp_only_layers, every step-th
            moe_layers=tuple(
                i for i in range(layers) if sparse and i not in dense and (i + 1) % step == 0
            ),
            sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window") else None,
        )
    else:
        return {}
    if fields["moe_layers"] and not 0 < fields["num_experts_per_tok"] <= fields["num_experts"]:
        raise ValueError(
            f"num_experts_per_tok={fields['num_experts_per_tok']} must be in "
            f"[1, num_experts={fields['num_experts']}]"
        )
    return fields

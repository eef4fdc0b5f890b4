"""ModelConfig: the few facts of a Hugging Face `config.json` the decoder needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


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
            qk_norm=arch == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
            dummy_init=raw.get("workbench_init", "normal"),
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

    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        qkv = h * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        o = self.num_heads * self.head_dim * h
        per_layer = qkv + o + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else v * h
        return self.num_layers * per_layer + v * h + head + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @property
    def tp_sizes(self) -> list[int]:
        """The tensor-parallel sizes this model splits into evenly: each divides the query
        heads, the KV heads and the MLP (a rank never holds part of a head or a GQA group)."""
        counts = (self.num_heads, self.num_kv_heads, self.intermediate_size)
        return [d for d in range(1, self.num_kv_heads + 1) if all(n % d == 0 for n in counts)]

"""Building the decoder and filling it: Hugging Face safetensors (q/k/v and gate/up merged) or
seeded dummy weights; and the way back to Hugging Face names. Every tensor-parallel rank reads (or
draws) the full weights and keeps its share, so any TP size computes what one rank does."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from ..distributed import SINGLE, TPGroup
from .config import ModelConfig
from .decoder import Decoder, full_shapes

# Hugging Face name -> (our merged parameter, its part); parts are stacked in this order
_MERGED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(
    model_cfg: ModelConfig,
    max_positions: int,
    device: torch.device,
    dtype: torch.dtype,
    weights_dir: Path | None,
    seed: int = 0,
    tp: TPGroup = SINGLE,
) -> Decoder:
    """A Decoder on `device` in `dtype`, with weights from `weights_dir` or seeded dummy ones;
    with `tp`, this rank's share of the same weights."""
    # the rotary tables stay float32 whatever the default dtype (they name their dtype)
    with torch.device(device), _default_dtype(dtype):
        model = Decoder(model_cfg, max_positions, tp)
    if weights_dir is not None and any(Path(weights_dir).glob("*.safetensors")):
        load_safetensors(model, Path(weights_dir))
    elif model_cfg.dummy_init == "induction":
        from .induction import init_induction

        init_induction(model, seed)
    else:
        init_dummy(model, seed)
    model.eval().requires_grad_(False)
    return model


def _slices(model: Decoder, param: str, index: int) -> tuple[int, int]:
    layer = model.model_cfg
    if param == "qkv_proj":
        q, kv = layer.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
        return [(0, q), (q, q + kv), (q + kv, q + 2 * kv)][index]
    i = layer.intermediate_size
    return [(0, i), (i, 2 * i)][index]


def _target(
    model: Decoder, params: dict[str, torch.Tensor], hf_name: str
) -> tuple[str, int | None] | None:
    """Our parameter name (and part, for merged projections) for a Hugging Face name."""
    name = hf_name.removeprefix("model.")
    if name == "lm_head.weight" and model.model_cfg.tie_word_embeddings:
        return None  # the embedding is the head
    m = re.match(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)_proj\.(weight|bias)$", name)
    part = None
    if m and f"{m[3]}_proj" in _MERGED:
        merged, part = _MERGED[f"{m[3]}_proj"]
        name = f"layers.{m[1]}.{m[2]}.{merged}.{m[4]}"
    if name not in params:
        raise KeyError(
            f"checkpoint tensor {hf_name!r} has no place in {model.model_cfg.architecture}"
        )
    return name, part


def load_safetensors(model: Decoder, path: Path) -> None:
    from safetensors import safe_open

    filled: set[str] = set()
    params = dict(model.named_parameters())
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for hf_name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                target = _target(model, params, hf_name)
                if target is None:
                    continue
                name, part = target
                model.load_param(name, f.get_tensor(hf_name), part)
                filled.add(name if part is None else f"{name}[{part}]")
    expected = _expected_fills(model)
    missing = expected - filled
    if missing:
        raise ValueError(f"checkpoint in {path} lacks {sorted(missing)[:5]} ...")


def _expected_fills(model: Decoder) -> set[str]:
    out = set()
    for n, _ in model.named_parameters():
        last = n.rsplit(".", 2)[-2]
        if last in ("qkv_proj", "gate_up_proj"):
            count = 3 if last == "qkv_proj" else 2
            out |= {f"{n}[{i}]" for i in range(count)}
        else:
            out.add(n)
    return out


@torch.no_grad()
def init_dummy(model: Decoder, seed: int) -> None:
    """Seeded random weights (normal, std 0.02; norms 1): same seed and device, same model,
    whatever the TP size (each rank draws every full parameter, in order, and keeps its share)."""
    gen: dict[torch.device, torch.Generator] = {}
    shapes = full_shapes(model.model_cfg) if model.tp.size > 1 else {}
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
            continue
        g = gen.setdefault(param.device, torch.Generator(param.device).manual_seed(seed))
        if model.tp.size == 1:
            param.normal_(0.0, 0.02, generator=g)
            continue
        full = torch.empty(shapes[name], dtype=param.dtype, device=param.device)
        model.load_param(name, full.normal_(0.0, 0.02, generator=g))


def to_hf_state_dict(model: Decoder) -> dict[str, torch.Tensor]:
    """Our weights under Hugging Face names (merged projections split again); one rank only."""
    if model.tp.size > 1:
        raise ValueError(
            f"to_hf_state_dict needs the whole model; this one is rank {model.tp.rank} of "
            f"tp_size={model.tp.size} (build it with tp_size=1)"
        )
    out: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if name.startswith("lm_head."):
            if not model.model_cfg.tie_word_embeddings:
                out["lm_head.weight"] = param.detach()
            continue
        m = re.match(
            r"layers\.(\d+)\.(self_attn|mlp)\.(qkv_proj|gate_up_proj)\.(weight|bias)$", name
        )
        if m is None:
            out[f"model.{name}"] = param.detach()
            continue
        parts = ("q", "k", "v") if m[3] == "qkv_proj" else ("gate", "up")
        for index, part in enumerate(parts):
            lo, hi = _slices(model, m[3], index)
            out[f"model.layers.{m[1]}.{m[2]}.{part}_proj.{m[4]}"] = param.detach()[lo:hi]
    return out

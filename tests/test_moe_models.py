"""Mixtures of experts (Qwen3-MoE, Mixtral): greedy output equals Hugging Face `generate` token
for token in float32 under every setting the dense models run; the configs' facts; routing that
spreads over the experts; the torch expert backend against Hugging Face's experts; checkpoints
with experts named per expert or fused, and those missing an expert or holding a wrong shape."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from workbench import LLM
from workbench.config import MOE_BACKEND_CHOICES, EngineConfig
from workbench.distributed import TPGroup
from workbench.layers.moe import MOE_BACKENDS, SparseMoE, experts_backend, torch_experts
from workbench.models import ModelConfig, names, resolve
from workbench.models.decoder import Decoder, full_shapes
from workbench.models.weights import build_model, to_hf_state_dict
from workbench.policies import POLICIES

from .conftest import PROMPTS, greedy, hf_greedy, run, shared

MOE_MODELS = ("tiny-qwen3-moe", "tiny-mixtral")
CPU = torch.device("cpu")


def _prompts(llm: LLM) -> list[list[int]]:
    """The dense test's prompts: different lengths, two sharing a prefix with a third."""
    ids = [llm.encode(p) for p in PROMPTS]
    return ids + [ids[3] + llm.encode(" and came back"), ids[3][:-2] + llm.encode(" at noon")]


def _check_greedy(llm: LLM, model: str, runs: int) -> list[dict]:
    ids = _prompts(llm)
    expected = hf_greedy(model, ids, 16)
    for _ in range(runs):
        outputs, _ = run(llm, ids, greedy(16))
        assert [o["token_ids"] for o in outputs] == expected
    return outputs


def _settings():
    for model in MOE_MODELS:
        for page_size in (1, 4):
            for budget in (1, 3, 16, 8192):
                for cache in ("naive", "radix"):
                    yield pytest.param(model, page_size, budget, cache)


@pytest.mark.parametrize("model, page_size, max_extend_tokens, cache", list(_settings()))
def test_greedy_matches_hf(model, page_size, max_extend_tokens, cache):
    """As the dense models' test: one batch of prompts of different lengths, chunked by the
    budget; with the radix cache a second run is served mostly from the cache."""
    llm = shared(lambda: LLM(model, page_size=page_size, max_running_reqs=8), model, page_size)
    llm.reconfigure(max_extend_tokens=max_extend_tokens, cache=cache)
    outputs = _check_greedy(llm, model, 2 if cache == "radix" else 1)
    if cache == "radix":
        assert all(
            o["cached_tokens"] >= (o["prompt_tokens"] - 1) // page_size * page_size for o in outputs
        )


@pytest.mark.parametrize("overlap", [False, True], ids=["no-overlap", "overlap"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("model", MOE_MODELS)
def test_policies_and_overlap_match_hf(model, policy, overlap):
    """Each policy, overlap off and on, under a budget that mixes prefill chunks and decodes."""
    llm = shared(lambda: LLM(model, page_size=1, max_running_reqs=8), model, 1)
    llm.reconfigure(max_extend_tokens=5, cache="radix", policy=policy, overlap=overlap)
    _check_greedy(llm, model, 2)


def test_routing_spreads_over_experts():
    """Over a prefill of the prompts every expert of every MoE layer gets tokens and none gets
    them all (the tiny models' routing is not degenerate); each forward counts top_k experts
    per token, in one row per MoE layer (tiny-qwen3-moe's dense layer 1 has none)."""
    llm = shared(
        lambda: LLM("tiny-qwen3-moe", page_size=1, max_running_reqs=8), "tiny-qwen3-moe", 1
    )
    llm.reconfigure(max_extend_tokens=8192, cache="naive", policy="prefill_first", overlap=False)
    engine, counts = llm.engine, []
    forward = engine.forward
    engine.forward = lambda launch: [forward(launch), counts.append(engine.ctx.routing.clone())][0]
    try:
        ids = _prompts(llm)
        run(llm, ids, greedy(2))
    finally:
        del engine.forward
    cfg = engine.model_config
    assert engine.model.layers[0].mlp.backend == "torch"  # "auto" on the cpu
    assert cfg.moe_layers == (0, 2) and counts[0].shape == (2, cfg.num_experts)
    prefill = counts[0]
    assert (prefill.sum(dim=1) == sum(map(len, ids)) * cfg.num_experts_per_tok).all()
    assert (prefill > 0).all()
    assert (prefill.max(dim=1).values < sum(map(len, ids))).all()


# -- configs and the catalog -------------------------------------------------------------------
def test_qwen3_30b_a3b_in_the_catalog_has_the_real_configuration():
    assert {"tiny-qwen3-moe", "tiny-mixtral", "dummy:qwen3-30b-a3b"} <= set(names())
    cfg = ModelConfig.from_dir(resolve("dummy:qwen3-30b-a3b"))
    assert cfg.architecture == "Qwen3MoeForCausalLM" and cfg.is_moe and cfg.qk_norm
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        2048,
        48,
        32,
        4,
        128,
    )
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (128, 8, 768)
    assert cfg.intermediate_size == 6144 and cfg.norm_topk_prob and cfg.vocab_size == 151936
    assert cfg.rope_theta == 1e6 and cfg.max_position_embeddings == 40960
    assert cfg.rms_norm_eps == 1e-6 and not cfg.tie_word_embeddings
    assert cfg.moe_layers == tuple(range(48)) and cfg.dense_layer_count == 0
    assert cfg.expert_params() == 3 * 2048 * 768
    assert cfg.tp_sizes == [1, 2, 4]
    shapes = full_shapes(cfg)
    assert shapes["layers.0.mlp.w13"] == (128, 2 * 768, 2048)
    assert shapes["layers.47.mlp.w2"] == (128, 2048, 768)
    assert shapes["layers.0.mlp.gate.weight"] == (128, 2048)
    with torch.device("meta"):  # each rank: half of every expert's intermediate size
        half = Decoder(cfg, 1, TPGroup(rank=1, size=2, group=object()))
    assert half.layers[0].mlp.w13.shape == (128, 768, 2048)
    assert half.layers[0].mlp.w2.shape == (128, 2048, 384)
    assert half.layers[0].mlp.gate.weight.shape == (128, 2048)  # the router is replicated


@pytest.mark.parametrize(
    "model", ["tiny-qwen2", "tiny-qwen3", *MOE_MODELS, "dummy:qwen3-30b-a3b", "dummy:llama-3-8b"]
)
def test_num_params_counts_what_transformers_builds(model):
    """Every expert of every MoE layer, routers, biases and q/k norms, as Hugging Face counts."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve(model)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    assert ModelConfig.from_dir(path).num_params() == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize(
    "step, mlp_only",
    [(1, []), (2, []), (1, [0, 3]), (3, [2])],
    ids=["all", "step2", "only", "both"],
)
def test_moe_layers_are_the_layers_transformers_makes_sparse(step, mlp_only):
    """`decoder_sparse_step` and `mlp_only_layers` pick the same layers as in Hugging Face; the
    others keep a dense MLP of intermediate_size."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.loads((resolve("tiny-qwen3-moe") / "config.json").read_text())
    raw.update(num_hidden_layers=6, decoder_sparse_step=step, mlp_only_layers=mlp_only)
    hf_cfg = AutoConfig.for_model(
        "qwen3_moe", **{k: v for k, v in raw.items() if k != "model_type"}
    )
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(hf_cfg)
    sparse = tuple(i for i, layer in enumerate(hf.model.layers) if hasattr(layer.mlp, "experts"))
    cfg = ModelConfig.from_dict(raw)
    assert cfg.moe_layers == sparse and sparse
    with torch.device("meta"):
        ours = Decoder(cfg, 1)
    for i, layer in enumerate(ours.layers):
        assert isinstance(layer.mlp, SparseMoE) == (i in sparse)
        if i in sparse:
            assert layer.mlp.moe_index == sparse.index(i)
        else:
            assert layer.mlp.gate_up_proj.weight.shape == (2 * 128, 64)


def test_a_sliding_window_shorter_than_the_context_is_refused(tmp_path):
    """Mixtral's sliding_window: null or at least the context; otherwise refused, saying which
    max_seq_len would do."""
    _copy_without_weights(resolve("tiny-mixtral"), tmp_path, sliding_window=32)
    with pytest.raises(ValueError, match=r"sliding_window=32.*context of 64 .*max_seq_len=32"):
        LLM(str(tmp_path), max_seq_len=64, max_running_reqs=2, warmup=False)
    llm = LLM(str(tmp_path), max_seq_len=32, max_running_reqs=2, warmup=False)
    assert llm.engine.model_config.sliding_window == 32
    llm.close()


def test_tp_size_must_divide_each_experts_intermediate_size():
    raw = json.loads((resolve("tiny-mixtral") / "config.json").read_text())
    cfg = ModelConfig.from_dict({**raw, "intermediate_size": 30, "num_key_value_heads": 4})
    assert cfg.tp_sizes == [1, 2]
    four = TPGroup(rank=0, size=4, group=object())  # never used: the check comes first
    with pytest.raises(ValueError, match=r"unevenly: moe_intermediate_size=30 \(.*allowed tp_size"):
        build_model(cfg, 16, CPU, torch.float32, None, tp=four)


def test_moe_backend_is_checked_and_resolved():
    assert set(MOE_BACKEND_CHOICES) == {"auto", *MOE_BACKENDS}
    assert EngineConfig(device="cpu").moe_backend_used == "torch"
    assert EngineConfig(device="cpu", moe_backend="torch").moe_backend_used == "torch"
    with pytest.raises(ValueError, match=r"moe_backend must be one of .*'fast'"):
        EngineConfig(device="cpu", moe_backend="fast")
    with pytest.raises(ValueError, match=r"moe_backend='triton' needs a CUDA device"):
        EngineConfig(device="cpu", moe_backend="triton")
    with pytest.raises(ValueError, match="unknown MoE backend 'fast'"):
        experts_backend("fast")
    assert experts_backend("torch") is torch_experts


# -- the torch backend -------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [1, 3, 40], ids=["gathered-1", "gathered-3", "dense-40"])
def test_torch_experts_equal_transformers_experts(tokens):
    """Both forms (each token's experts gathered: fewer picks than experts; every expert over
    every token: more) compute what Hugging Face's expert loop computes, from the same weights."""
    from transformers import AutoConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = AutoConfig.from_pretrained(resolve("tiny-qwen3-moe"))
    gen = torch.Generator().manual_seed(tokens)
    hf = Qwen3MoeExperts(cfg)
    with torch.no_grad():
        hf.gate_up_proj.normal_(0, 0.1, generator=gen)
        hf.down_proj.normal_(0, 0.1, generator=gen)
    x = torch.randn(tokens, cfg.hidden_size, generator=gen)
    scores = torch.rand(tokens, cfg.num_experts, generator=gen)
    weights, ids = torch.topk(scores.softmax(-1), cfg.num_experts_per_tok, dim=-1)
    with torch.no_grad():
        ours = torch_experts(x, hf.gate_up_proj, hf.down_proj, weights, ids)
        ref = hf(x, ids, weights)
    assert ours.shape == ref.shape == (tokens, cfg.hidden_size)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1, 64], ids=["gathered", "dense"])
def test_torch_experts_run_without_host_sync_inside_a_cuda_graph(tokens):
    """Qwen3-30B-A3B's expert shapes: no host sync (torch's sync debug mode raises on one), and
    a captured graph replayed on new inputs and new routing computes what an eager call does."""
    dev, gen = torch.device("cuda"), torch.Generator("cuda").manual_seed(0)
    experts, top_k, hidden, inter = 128, 8, 2048, 768

    def draw(*shape):
        return torch.randn(*shape, device=dev, generator=gen, dtype=torch.bfloat16) * 0.05

    def routing():
        weights, ids = torch.topk(torch.rand(tokens, experts, device=dev, generator=gen), top_k)
        return weights.to(torch.bfloat16), ids

    w13, w2, x = (
        draw(experts, 2 * inter, hidden),
        draw(experts, hidden, inter),
        draw(tokens, hidden),
    )
    weights, ids = routing()
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch_experts(x, w13, w2, weights, ids)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    side = torch.cuda.Stream()  # NOTE: the warm-up before a capture, on a stream of its own
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch_experts(x, w13, w2, weights, ids)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch_experts(x, w13, w2, weights, ids)
    new_weights, new_ids = routing()
    x.copy_(draw(tokens, hidden)), weights.copy_(new_weights), ids.copy_(new_ids)
    graph.replay()
    assert torch.equal(out, torch_experts(x, w13, w2, weights, ids))


# -- checkpoints -------------------------------------------------------------------------------
def _copy_without_weights(src, dst, **config_changes) -> None:
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    if config_changes:
        raw = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**raw, **config_changes}))


def _load(path):
    return build_model(ModelConfig.from_dir(path), 16, CPU, torch.float32, path)


@pytest.mark.parametrize("model", MOE_MODELS)
def test_experts_load_from_per_expert_and_fused_names_alike(model, tmp_path):
    """The catalog's checkpoints name each expert (transformers' save_pretrained writes
    `mlp.experts.{e}.gate_proj` for Qwen3-MoE, `block_sparse_moe.experts.{e}.w1` for Mixtral);
    the in-memory names (`mlp.experts.gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]) that
    `to_hf_state_dict` gives load into the same parameters."""
    src = resolve(model)
    per_expert = load_file(src / "model.safetensors")
    assert any(".experts.0." in k for k in per_expert)
    if model == "tiny-mixtral":
        assert "model.layers.0.block_sparse_moe.experts.0.w1.weight" in per_expert
    loaded = _load(src)
    fused = to_hf_state_dict(loaded)
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused
    assert not any(".experts.0." in k for k in fused)
    _copy_without_weights(src, tmp_path)
    save_file({k: v.contiguous() for k, v in fused.items()}, tmp_path / "model.safetensors")
    again = _load(tmp_path)
    for (name, a), (_, b) in zip(loaded.named_parameters(), again.named_parameters()):
        assert torch.equal(a, b), name
    e, inter = 3, loaded.layers[0].mlp.intermediate_size
    gate = (
        "mlp.experts.3.gate_proj" if model == "tiny-qwen3-moe" else "block_sparse_moe.experts.3.w1"
    )
    assert torch.equal(
        loaded.layers[0].mlp.w13[e, :inter], per_expert[f"model.layers.0.{gate}.weight"]
    )


def _broken(model, tmp_path, change) -> str:
    src = resolve(model)
    tensors = load_file(src / "model.safetensors")
    change(tensors)
    _copy_without_weights(src, tmp_path)
    save_file(tensors, tmp_path / "model.safetensors")
    return str(tmp_path)


def test_a_missing_expert_tensor_is_refused_by_name(tmp_path):
    name = "model.layers.1.block_sparse_moe.experts.5.w3.weight"
    path = _broken("tiny-mixtral", tmp_path, lambda t: t.pop(name))
    with pytest.raises(ValueError, match=rf"lacks '{name}' \[48, 64\]"):
        _load(tmp_path)
    with pytest.raises(ValueError, match=rf"lacks '{name}'"):  # and through the engine
        LLM(path, max_running_reqs=2, warmup=False)


def test_a_misshaped_expert_tensor_is_refused_with_the_shape_expected(tmp_path):
    name = "model.layers.2.mlp.experts.6.down_proj.weight"

    def cut(tensors):
        tensors[name] = tensors[name][:, :31].contiguous()

    _broken("tiny-qwen3-moe", tmp_path, cut)
    with pytest.raises(ValueError, match=rf"'{name}'.*shape \[64, 31\]; .* expects \[64, 32\]"):
        _load(tmp_path)


def test_a_fused_expert_tensor_of_the_wrong_count_is_refused(tmp_path):
    src = resolve("tiny-qwen3-moe")
    fused = to_hf_state_dict(_load(src))
    name = "model.layers.0.mlp.experts.gate_up_proj"
    fused[name] = fused[name][:7]
    _copy_without_weights(src, tmp_path)
    save_file({k: v.contiguous() for k, v in fused.items()}, tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError, match=rf"'{name}'.*shape \[7, 64, 64\]; .* expects \[8, 64, 64\]"
    ):
        _load(tmp_path)


def test_an_expert_beyond_the_count_has_no_place(tmp_path):
    def extra(tensors):
        tensors["model.layers.0.mlp.experts.8.up_proj.weight"] = torch.zeros(32, 64)

    _broken("tiny-qwen3-moe", tmp_path, extra)
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.experts.8.up_proj.weight' has no"):
        _load(tmp_path)


@pytest.mark.parametrize("model", MOE_MODELS)
def test_dummy_moe_weights_load_into_transformers_and_agree(model, tmp_path):
    """A directory without weights gets seeded dummy weights (every expert and router drawn);
    under Hugging Face's names they are the same model to transformers, token for token."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _copy_without_weights(resolve(model), tmp_path)
    llm = LLM(str(tmp_path), max_running_reqs=4)
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path), dtype=torch.float32)
    hf.load_state_dict(to_hf_state_dict(llm.engine.model), strict=True)
    ids = [llm.encode(p) for p in PROMPTS[:3]]
    outputs, _ = run(llm, ids, greedy(8))
    llm.close()
    for out, prompt in zip(outputs, ids):
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False
        )[0, len(prompt) :].tolist()
        assert out["token_ids"] == ref

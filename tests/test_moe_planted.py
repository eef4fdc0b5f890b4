"""A mixture of experts with a known answer: the planted induction model (`models/induction.py`)
as Qwen3-MoE, every layer sparse, its routers and experts the small noise a dense model's MLPs
are. Its greedy answer is the pattern's continuation with a wide margin, so every setting must
give it token for token, in float32 on the CPU and in bf16 on the GPU, where the fused Triton
experts, the torch experts, CUDA graphs and overlap are settings like the chunk size.

The workload is the GPU matrix's (`planted.py`): arrivals, a shared document, more requests than
slots, two aborts; integrity after every run. `pytest -m gpu -s tests/test_moe_planted.py` prints
the GPU's summary and the fused experts' logits against the torch experts'.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from workbench import LLM, Workbench
from workbench.config import EngineConfig
from workbench.models.induction import pattern_prompts

from .conftest import prefill_logits
from .planted import check_decisive, run_workload

MODELS = {"cpu": "dummy:tiny-moe-induction", "cuda": "dummy:qwen3-moe-induction"}
POLICIES = ("prefill_first", "decode_first", "mixed")
GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

_engines: dict[tuple, Workbench] = {}


def engine(device: str, page_size: int = 1, graphs: bool = False, backend: str = "auto"):
    key = (device, page_size, graphs, backend)
    if key not in _engines:
        _close_all()  # one at a time: each holds its own pool (and graphs)
        _engines[key] = Workbench(
            MODELS[device],
            device=device,
            page_size=page_size,
            cuda_graph=graphs,
            moe_backend=backend,
            num_pages=16384 // page_size,
            max_running_reqs=8,
            cuda_graph_max_bs=8,
        )
    return _engines[key]


def _close_all() -> None:
    for wb in _engines.values():
        wb.close()
    _engines.clear()


@pytest.fixture(scope="module", autouse=True)
def _release():
    yield
    _close_all()


def _check_routing(wb: Workbench) -> None:
    """Every step routed its tokens, and over the run every expert of every MoE layer got some
    (the routers are noise: no expert is left out)."""
    history, cfg = wb.history, wb.engine.model_config
    assert history.steps.experts_touched.notna().all()
    used = history.routing.groupby("layer").expert.nunique()
    assert sorted(used.index) == list(cfg.moe_layers)
    assert (used == cfg.num_experts).all()


# (the matrix's chunk sizes, whose mixed steps its checks know; the dense model's equality
# with Hugging Face covers every setting on the CPU, so three here: each policy once)
CPU_SETTINGS = [(16, "mixed", True), (8192, "prefill_first", False), (1, "decode_first", True)]


@pytest.mark.parametrize(
    "chunk, policy, overlap",
    CPU_SETTINGS,
    ids=[f"chunk{c}-{p}-{'overlap' if o else 'serial'}" for c, p, o in CPU_SETTINGS],
)
@pytest.mark.slow  # ~15 s; experts against HF in every policy: test_moe_models.py
def test_the_planted_moe_model_answers_every_setting_on_the_cpu(chunk, policy, overlap):
    wb = engine("cpu")
    run_workload(wb, chunk, policy, overlap, graphs=False)
    _check_routing(wb)


def test_the_planted_moe_models_answer_is_decisive():
    """float32: the top logit leads the next by far more than bf16 (or another expert kernel's
    summation order) could move it."""
    llm = LLM(MODELS["cpu"], device="cpu", num_pages=4096, max_extend_tokens=17)
    prompts = [
        pattern_prompts(random.Random(seed), [n], period=p)[0]
        for seed, n, p in ((1, 40, 7), (2, 75, 19), (3, 16, 3), (4, 120, 23))
    ]
    check_decisive(llm, prompts)
    llm.close()


# -- on the GPU --------------------------------------------------------------------------------
GPU_SETTINGS = [
    (16, backend, graphs, chunk, policy, i % 2 == 0)
    for i, (backend, graphs, chunk, policy) in enumerate(
        itertools.product(("triton", "torch"), (True, False), (16, 8192), POLICIES)
    )
] + [(1, "triton", True, chunk, "mixed", True) for chunk in (16, 8192)]


@pytest.mark.parametrize(
    "page_size, backend, graphs, chunk, policy, overlap",
    [pytest.param(*s, marks=GPU) for s in GPU_SETTINGS],
    ids=[
        f"page{p}-{b}-{'graphs' if g else 'eager'}-chunk{c}-{pol}-{'overlap' if o else 'serial'}"
        for p, b, g, c, pol, o in GPU_SETTINGS
    ],
)
def test_the_planted_moe_model_answers_every_setting_on_the_gpu(
    page_size, backend, graphs, chunk, policy, overlap
):
    """bf16: the fused Triton experts and the torch experts, CUDA graphs or eager, give the
    pattern's continuation; with graphs, decode steps and prompt steps replay them as a dense
    model's do."""
    wb = engine("cuda", page_size, graphs, backend)
    run_workload(wb, chunk, policy, overlap, graphs)
    _check_routing(wb)
    if graphs:
        steps = wb.history.steps
        assert steps.cuda_graph[steps.phase == "decode"].all()
        if wb.engine.graphs.prompt_shapes:  # (FlashInfer's planner as we know it)
            assert steps.cuda_graph[steps.phase != "decode"].all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_fused_experts_are_the_gpus_default_and_agree_with_torchs():
    """Last-position logits of 32 pattern prompts, fused Triton experts against torch experts
    on the same weights, both in bf16 with CUDA graphs. Stated tolerance: the largest difference
    at most 1% of the largest logit; the same top token everywhere, its smallest margin over the
    second above 25x that difference."""
    assert EngineConfig(device="cuda").moe_backend_used == "triton"
    rng = random.Random(7)
    prompts = [
        pattern_prompts(rng, [rng.randint(20, 400)], period=rng.randint(3, 40))[0]
        for _ in range(32)
    ]
    logits = {}
    _close_all()
    for backend in ("triton", "torch"):
        llm = LLM(MODELS["cuda"], moe_backend=backend, num_pages=16384, max_running_reqs=32)
        assert llm.config.moe_backend_used == backend
        logits[backend] = prefill_logits(llm, prompts)
        llm.check_integrity()
        llm.close()
    fused, ref = logits["triton"], logits["torch"]
    diff = (fused - ref).abs().max().item()
    top2 = ref.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    scale = ref.abs().max().item()
    print(
        f"\nplanted MoE model, 32 prompts, largest logit {scale:.1f}, smallest top-two margin "
        f"{margin:.1f}: fused Triton experts against torch experts, largest difference {diff:.4f}"
    )
    assert diff <= 0.01 * scale
    assert torch.equal(fused.argmax(-1), ref.argmax(-1))
    assert margin > 25 * diff

"""The GPU correctness matrix, the counterpart of the CPU's Hugging Face equality tests.

Chunk size {1, 16, 64, 256, 8192} x page size {1, 16} x policy x overlap x CUDA graphs: 120
settings, one workload each: requests arriving while others decode, four sharing a document
through the radix cache, more requests than slots, one aborted mid-prompt and one mid-decode.
Integrity is checked after every run.

In bf16 the comparison must be decisive, so the model is the planted induction model
(`models/induction.py`, Qwen3-0.6B's shapes with 4 layers): its greedy answer is the pattern's
continuation, with the winning logit hundreds of bf16 rounding errors ahead. Every output must
equal that continuation, so all settings agree token for token. Its prefill logits are compared
with transformers on the same GPU (same weights).

Run with `pytest -m gpu -s tests/test_gpu_matrix.py`: the summary lines are what notes quote.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest
import torch

from workbench import LLM, SamplingParams, Workbench
from workbench.models import resolve
from workbench.models.induction import pattern_prompts
from workbench.models.weights import to_hf_state_dict

from .conftest import prefill_logits
from .planted import run_workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

MODEL = "dummy:qwen3-induction"
CHUNKS = (1, 16, 64, 256, 8192)
PAGE_SIZES = (1, 16)
POLICIES = ("prefill_first", "decode_first", "mixed")
SETTINGS = list(itertools.product(PAGE_SIZES, (True, False), CHUNKS, POLICIES, (True, False)))


_engines: dict[tuple[int, bool], Workbench] = {}
_results: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def summary():
    start = time.perf_counter()
    yield
    _engines.clear()
    if not _results:
        return
    runs, outputs = len(_results), sum(r["outputs"] for r in _results)
    exact = sum(r["exact"] for r in _results)
    mid_prompt = sum(r["mid_prompt"] for r in _results)
    print(
        f"\nGPU matrix: {runs} settings; {exact}/{outputs} finished outputs equal the pattern's "
        f"continuation (identical across settings); aborted mid-prompt in {mid_prompt} runs "
        f"(in the others its whole prompt ran in one step without overlap, so it was aborted "
        f"after its first token), mid-decode in {sum(r['mid_decode'] for r in _results)}; "
        f"integrity after every run; {time.perf_counter() - start:.0f} s"
    )


def engine(page_size: int, graphs: bool) -> Workbench:
    key = (page_size, graphs)
    if key not in _engines:
        _engines[key] = Workbench(
            MODEL,
            page_size=page_size,
            cuda_graph=graphs,
            num_pages=16384 // page_size,
            max_running_reqs=8,
            cuda_graph_max_bs=8,
        )
    return _engines[key]


@pytest.mark.parametrize(
    "page_size, graphs, chunk, policy, overlap",
    SETTINGS,
    ids=[
        f"page{p}-{'graphs' if g else 'eager'}-chunk{c}-{pol}-{'overlap' if o else 'serial'}"
        for p, g, c, pol, o in SETTINGS
    ],
)
def test_matrix(page_size, graphs, chunk, policy, overlap):
    wb = engine(page_size, graphs)
    _results.append(run_workload(wb, chunk, policy, overlap, graphs))


def _logit_gap(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    err = (a - b).abs()
    top2 = b.topk(2, dim=-1).values
    return dict(
        max=err.max().item(),
        top1=(a.argmax(-1) == b.argmax(-1)).float().mean().item(),
        margin=(top2[:, 0] - top2[:, 1]).min().item(),
    )


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_prefill_logits_against_transformers(page_size):
    """Last-position logits of 32 pattern prompts (bf16, FlashInfer) against transformers on
    the same GPU with the same weights, in bf16 and in float32. Stated tolerance: the largest
    error against float32 at most 1% of the largest logit, and at most twice transformers' own
    bf16 error; the same top token everywhere, with the smallest top-two margin above 25x our
    largest error."""
    from transformers import AutoConfig, AutoModelForCausalLM

    llm = LLM(MODEL, page_size=page_size, num_pages=16384 // page_size, max_running_reqs=32)
    rng = random.Random(7)
    prompts = [
        pattern_prompts(rng, [rng.randint(20, 400)], period=rng.randint(3, 40))[0]
        for _ in range(32)
    ]
    ours = prefill_logits(llm, prompts)
    llm.check_integrity()
    config = AutoConfig.from_pretrained(resolve(MODEL))
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).cuda().eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(llm.engine.model), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    with torch.inference_mode():
        ref32 = torch.stack([hf(torch.tensor([p], device="cuda")).logits[0, -1] for p in prompts])
        hf.bfloat16()
        ref16 = torch.stack([hf(torch.tensor([p], device="cuda")).logits[0, -1] for p in prompts])
    ref32, ref16 = ref32.float(), ref16.float()
    ours_vs_32, ours_vs_16, hf16_vs_32 = (
        _logit_gap(ours, ref32),
        _logit_gap(ours, ref16),
        _logit_gap(ref16, ref32),
    )
    scale = ref32.abs().max().item()
    print(
        f"\ninduction model, page size {page_size}, 32 prompts, largest logit {scale:.1f}, "
        f"smallest top-two margin {ours_vs_32['margin']:.1f}: max abs error ours vs "
        f"transformers fp32 {ours_vs_32['max']:.3f}, vs transformers bf16 "
        f"{ours_vs_16['max']:.3f}; transformers bf16 vs fp32 {hf16_vs_32['max']:.3f}; "
        f"top-1 agreement {ours_vs_32['top1']:.0%}"
    )
    assert ours_vs_32["max"] <= 0.01 * scale
    assert ours_vs_32["max"] <= 2 * hf16_vs_32["max"]
    assert ours_vs_32["top1"] == 1.0 and ours_vs_16["top1"] == 1.0
    assert ours_vs_32["margin"] > 25 * ours_vs_32["max"]
    del llm, hf


@pytest.mark.parametrize("overlap", [True, False])
def test_the_chunked_prefill_crash_of_issue_11(overlap):
    """As reported: a 300-token prompt under a budget of 64 on dummy Qwen3-0.6B."""
    llm = LLM(
        "dummy:qwen3-0.6b",
        max_extend_tokens=64,
        overlap=overlap,
        num_pages=4096,
        max_running_reqs=4,
        cuda_graph_max_bs=4,
    )
    out = llm.generate([list(range(1, 301))], SamplingParams(max_tokens=4))
    llm.check_integrity()
    assert out[0]["completion_tokens"] == 4

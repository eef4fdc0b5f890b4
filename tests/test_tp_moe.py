"""Tensor parallelism of a mixture of experts on the CPU: rank 0 here, a second process (gloo);
each rank holds half of every expert's intermediate size (and the whole router), one all-reduce
sums the experts' halves. Greedy output equals Hugging Face token for token, with a dense layer
(mlp_only_layers) between the MoE ones, under chunked prefill, each policy, overlap off and on."""

from __future__ import annotations

import pytest

from workbench import Workbench
from workbench.policies import POLICIES

from .conftest import greedy, hf_greedy, run
from .test_tp import PROMPTS  # (the dense model's, one sharing a prefix)

MODEL = "tiny-qwen3-moe"  # 8 experts of 32 (16 a rank), top 2; layer 1 dense (128: 64 a rank)


@pytest.fixture(scope="module")
def wb2():
    wb = Workbench(MODEL, device="cpu", tp_size=2, max_running_reqs=8, record="light")
    yield wb
    wb.close()


@pytest.mark.parametrize("overlap", [False, True], ids=["no-overlap", "overlap"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("max_extend_tokens", [3, 8192])
@pytest.mark.slow  # ~24 s; two ranks against HF: test_tp.py, experts against HF: test_moe_models.py
def test_two_ranks_of_experts_match_hf(wb2, policy, max_extend_tokens, overlap):
    layer = wb2.llm.engine.model.layers[0].mlp
    assert (layer.w13.shape[1], layer.w2.shape[2]) == (32, 16)  # this rank's half of each expert
    wb2.reconfigure(policy=policy, max_extend_tokens=max_extend_tokens, overlap=overlap)
    expected = hf_greedy(MODEL, PROMPTS, 10)
    for _ in range(2):  # the second run from the radix cache
        outputs, steps = run(wb2.llm, PROMPTS, greedy(10))
        assert [o["token_ids"] for o in outputs] == expected
        assert all(s.tp_size == 2 for s in steps)

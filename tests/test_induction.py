"""The planted induction model: its known answer, and transformers agreeing with it."""

from __future__ import annotations

import random

import pytest
import torch

from workbench import LLM
from workbench.models import resolve
from workbench.models.induction import pattern_continuation, pattern_prompts

from .planted import check_decisive, planted_in_transformers


def test_pattern_continuation_and_its_refusals():
    assert pattern_continuation([9, 1, 2, 3, 1, 2], 5) == [3, 1, 2, 3, 1]
    with pytest.raises(ValueError, match="no single answer"):
        pattern_continuation([9, 1, 2, 1, 3, 1], 1)  # 1 was followed by 2 and by 3
    with pytest.raises(ValueError, match="no single answer"):
        pattern_continuation([9, 1, 2, 3], 1)  # 3 never occurred before
    with pytest.raises(ValueError, match="first token"):
        pattern_continuation([1, 2, 1, 2], 1)
    prompts = pattern_prompts(random.Random(0), [12, 20], period=5)
    assert prompts[1][:12] == prompts[0] and len(prompts[1]) == 20
    with pytest.raises(ValueError, match="at least 10"):
        pattern_prompts(random.Random(0), [9], period=5)


def test_planted_model_continues_patterns_as_transformers_does():
    """float32 on the CPU: our engine and transformers (same weights) both answer the
    pattern's continuation, and their last-position logits agree; the top logit leads the
    next one by far more than bf16 could move it."""
    llm = LLM("dummy:qwen3-induction", device="cpu", num_pages=2048, max_extend_tokens=17)
    prompts = [
        pattern_prompts(random.Random(seed), [n], period=p)[0]
        for seed, n, p in ((2, 75, 19), (3, 16, 3))
    ]
    check_decisive(llm, prompts)
    expected = [pattern_continuation(p, 8) for p in prompts]

    hf = planted_in_transformers(llm)
    with torch.inference_mode():
        for prompt, want in zip(prompts, expected):
            ids = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
            assert ids[0, len(prompt) :].tolist() == want


def test_induction_init_refuses_shapes_it_cannot_plant():
    with pytest.raises(ValueError, match="Qwen3 model with tied embeddings"):
        from workbench.models import ModelConfig
        from workbench.models.induction import init_induction
        from workbench.models.weights import build_model

        cfg = ModelConfig.from_dir(resolve("tiny-llama"))
        model = build_model(cfg, 64, torch.device("cpu"), torch.float32, None)
        init_induction(model, 0)

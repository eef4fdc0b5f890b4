"""The CUDA graphs' path on the CPU: `padded_steps=True` runs every step that fits a graph shape
(`engine/graph.py`) padded to it and eagerly, through the same static buffers, dummy rows and
tokens, and plans as a replay, with the torch attention backend. Its greedy output must still
equal Hugging Face's token for token in float32, under every budget, page size, policy and
overlap setting; its records carry the padding; a mixture of experts' padding chooses experts
but is not counted in the routing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from workbench import LLM, Workbench
from workbench.engine.graph import capture_sizes, token_sizes

from .conftest import PROMPTS, greedy, hf_greedy, run
from .planted import run_workload

MAX_TOKENS = 32  # prompt steps above it run eagerly: both paths in one run
SETTINGS = list(
    itertools.product((3, 16, 8192), ("prefill_first", "decode_first", "mixed"), (False, True))
)


@pytest.mark.parametrize("model, page_size", [("tiny-llama", 4), ("tiny-qwen3", 1)])
def test_padded_steps_match_hf_in_every_setting(model, page_size):
    """Prompts of different lengths, two sharing a prefix (the radix cache serves it), under
    each budget x policy x overlap on one engine (`reconfigure`); every step that fits a shape
    ran padded to the smallest that holds it, and the pool is intact after each run."""
    llm = LLM(
        model,
        page_size=page_size,
        max_running_reqs=8,
        cuda_graph_max_bs=4,  # batches of 5 and more decode unpadded
        cuda_graph_max_tokens=MAX_TOKENS,
        padded_steps=True,
        record="light",
    )
    try:
        graphs = llm.engine.graphs
        assert graphs is not None and not graphs.capture and graphs.prompt_shapes
        ids = [llm.encode(p) for p in PROMPTS]
        ids += [ids[3] + llm.encode(" and came back"), ids[3][:-2] + llm.encode(" at noon")]
        expected = hf_greedy(model, ids, 12)
        padded = {"decode": 0, "prompt": 0}
        for budget, policy, overlap in SETTINGS:
            llm.reconfigure(max_extend_tokens=budget, policy=policy, overlap=overlap)
            outputs, records = run(llm, ids, greedy(12))
            setting = f"budget {budget}, {policy}, overlap {overlap}"
            assert [o["token_ids"] for o in outputs] == expected, setting
            _check_padding(records, max_bs=4)
            for r in records:
                padded["decode" if r.phase == "decode" else "prompt"] += r.padding_tokens > 0
            assert not any(r.cuda_graph for r in records)
        assert padded["decode"] and padded["prompt"], padded
    finally:
        llm.close()


def _check_padding(records, max_bs: int) -> None:
    decode_sizes, prompt_sizes = set(capture_sizes(max_bs)), set(token_sizes(MAX_TOKENS))
    for r in records:
        padded = r.num_tokens + r.padding_tokens
        if r.phase == "decode":
            fits = r.size <= max_bs
            assert (padded in decode_sizes) if fits else r.padding_tokens == 0, r
        else:
            fits = r.num_tokens <= MAX_TOKENS
            assert (padded in prompt_sizes) if fits else r.padding_tokens == 0, r
        assert r.padding_tokens >= 0


def test_padded_steps_of_a_mixture_of_experts_count_only_the_batchs_tokens():
    """The planted MoE model's workload (arrivals, a shared document, two aborts) padded: every
    answer is the pattern's continuation, and each step's routing counts its own tokens' top-k
    choices in every MoE layer, not its padding's."""
    wb = Workbench(
        "dummy:tiny-moe-induction",
        num_pages=4096,
        max_running_reqs=8,
        cuda_graph_max_bs=8,
        cuda_graph_max_tokens=64,
        padded_steps=True,
    )
    try:
        run_workload(wb, 16, "mixed", True, graphs=False)
        steps, routing = wb.history.steps.set_index("step"), wb.history.routing
        cfg = wb.engine.model_config
        assert steps.padding_tokens.sum() > 0
        per_layer = routing.groupby(["step", "layer"]).tokens.sum().unstack()
        assert sorted(per_layer.columns) == list(cfg.moe_layers)
        want = steps.num_tokens.loc[per_layer.index].to_numpy() * cfg.num_experts_per_tok
        assert (per_layer.to_numpy() == want[:, None]).all()
    finally:
        wb.close()


def test_padded_steps_are_refused_when_not_a_boolean():
    with pytest.raises(TypeError, match="padded_steps must be True or False, got 'yes'"):
        LLM("tiny-llama", padded_steps="yes")


def test_without_padded_steps_the_cpu_runs_steps_unpadded():
    llm = LLM("tiny-llama", max_running_reqs=4, record="light")
    try:
        assert llm.engine.graphs is None
        llm.generate(PROMPTS[:3], greedy(4))
        assert (llm.history.steps.padding_tokens == 0).all()
        assert np.all(llm.history.steps.num_tokens > 0)
    finally:
        llm.close()


class InjectedFault(RuntimeError):
    pass


def test_an_engine_whose_graphs_fail_to_build_gives_its_memory_back(monkeypatch):
    """A shape that fails to plan (on the GPU: a kernel FlashInfer cannot run) fails the build
    with its own error, and nothing of the half-built engine stays alive while that error does
    (a notebook keeps it, as pytest does): on a GPU the next engine found the memory taken."""
    import weakref

    from workbench.attention.torch_backend import TorchGraphs
    from workbench.engine.graph import GraphRunner

    planned, held = [], {}
    plan_all, metadata = GraphRunner._plan_all, TorchGraphs.metadata

    def watched(runner):
        held.update(runner=weakref.ref(runner), model=weakref.ref(runner.model))
        return plan_all(runner)

    def failing(graphs, shape, x):
        planned.append(shape)
        if len(planned) == 3:
            raise InjectedFault(f"cannot plan {shape}")
        return metadata(graphs, shape, x)

    monkeypatch.setattr(GraphRunner, "_plan_all", watched)
    monkeypatch.setattr(TorchGraphs, "metadata", failing)
    with pytest.raises(InjectedFault, match="cannot plan") as info:
        LLM("tiny-llama", max_running_reqs=4, padded_steps=True, cuda_graph_max_tokens=32)
    assert info.value.__traceback__ is not None and set(held) == {"runner", "model"}
    assert held["runner"]() is None and held["model"]() is None
    monkeypatch.undo()
    llm = LLM("tiny-llama", max_running_reqs=4, padded_steps=True, cuda_graph_max_tokens=32)
    assert llm.generate(PROMPTS[:2], greedy(3))[0]["completion_tokens"] == 3
    llm.close()

"""An MoE model's routing in the record: each step's tokens per expert per MoE layer equal the
router's choice recomputed from the layers' own inputs; the roofline reads the experts touched
and the dense weights; the run file, the `moe.route` hook, the views and the twin carry it; a
dense run has none of it (NaN columns, an empty routing table, no MoE charts)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from workbench import LLM, Workbench, fit_step_costs, load_run
from workbench.attention.context import ForwardContext
from workbench.bench.steps import decode_step, step_time
from workbench.history.roofline import H200, Roofline, decode_step_bound, routed_experts
from workbench.instrument.probe import Probe
from workbench.layers.moe import SparseMoE
from workbench.runs import RunHistory
from workbench.scheduler.scheduler import Scheduler
from workbench.twin.costs import Linear, StepCosts
from workbench.twin.features import device_features
from workbench.twin.routing import expected_touched, independent_tokens

from .conftest import PROMPTS, greedy
from .test_twin import (
    NUM_PAGES,
    assert_same_schedule,
    run_workload,
    synthetic_costs,
    timed_runs,
    workload,
)

MODEL = "tiny-qwen3-moe"  # 8 experts, 2 per token; layers 0 and 2 sparse, layer 1 dense
# on the GPU a head size FlashInfer has kernels for (tiny-qwen3-moe's 32 fails its prefill
# kernel's configuration check): 64 experts, 8 per token, every layer sparse
GPU_MODEL = "dummy:qwen3-moe-induction"
LONG = PROMPTS[3] * 2


def mixed_run(**options) -> Workbench:
    """Chunks, whole prompts, decodes and mixed batches, one late arrival."""
    wb = Workbench(MODEL, max_extend_tokens=16, max_running_reqs=4, policy="mixed", **options)
    wb.add_request(LONG, greedy(5))
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(6))
    wb.add_request(PROMPTS[4], greedy(4), arrival_step=4)
    return wb


class RouterInputs:
    """Each MoE block's input at the forward of the step being taken (a forward pre-hook), and
    the router's choice recomputed from it: softmax(x W_gate^T) in float32, top-k, counted."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.blocks = sorted(
            (m for m in model.modules() if isinstance(m, SparseMoE)), key=lambda m: m.moe_index
        )
        self.inputs: dict[int, torch.Tensor] = {}
        self.handles = [b.register_forward_pre_hook(self._keep) for b in self.blocks]

    def _keep(self, block: SparseMoE, args) -> None:
        assert block.moe_index not in self.inputs, "one forward per step"
        self.inputs[block.moe_index] = args[0].detach().clone()

    def counts(self, tokens: int | None = None) -> np.ndarray:
        """The counts of the step's first `tokens` tokens (None: all; a padded graph's are
        first, its padding last)."""
        rows = []
        for block in self.blocks:
            x = self.inputs[block.moe_index]
            logits = torch.nn.functional.linear(x, block.gate.weight)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            chosen = probs.topk(block.top_k, dim=-1).indices[:tokens]
            rows.append(torch.bincount(chosen.reshape(-1), minlength=block.num_experts))
        self.inputs.clear()
        return torch.stack(rows).cpu().numpy()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.fixture(scope="module")
def moe():
    """A mixed run of the MoE model, each step's routing recomputed beside it."""
    wb = mixed_run()
    router = RouterInputs(wb.engine.model)
    expected = {}
    while (record := wb.step()) is not None:
        expected[record.step] = router.counts()
    router.remove()
    wb.check_integrity()
    return wb, expected


def test_the_record_holds_the_routers_choice_recomputed_from_each_moe_layers_input(moe):
    wb, expected = moe
    cfg = wb.engine.model_config
    records = wb.history.records
    assert len(records) == len(expected) > 5
    assert {"prefill", "decode", "mixed"} <= {r.phase for r in records}
    for rec in records:
        assert rec.moe_layers == cfg.moe_layers == (0, 2)
        assert rec.routing.dtype == np.int32 and rec.routing.shape == (2, cfg.num_experts)
        np.testing.assert_array_equal(rec.routing, expected[rec.step], err_msg=f"step {rec.step}")
        # each token counted once per chosen expert, in each MoE layer
        assert (rec.routing.sum(axis=1) == rec.num_tokens * cfg.num_experts_per_tok).all()
    # the table: nonzero counts only, the decoder layer's index, the same counts
    table = wb.history.routing
    assert (table.tokens > 0).all() and set(table.layer) == {0, 2}
    for rec in records:
        rows = table[table.step == rec.step]
        counts = np.zeros_like(rec.routing)
        counts[rows.layer.map({0: 0, 2: 1}), rows.expert] = rows.tokens
        np.testing.assert_array_equal(counts, rec.routing)
    # the steps table's columns, as `history/routing.py` defines them
    steps = wb.history.steps.set_index("step")
    for rec in records:
        touched = (expected[rec.step] > 0).sum(axis=1).mean()
        assert steps.experts_touched[rec.step] == pytest.approx(touched)
        mean = expected[rec.step].mean(axis=1)
        imbalance = (expected[rec.step].max(axis=1) / mean).mean()
        assert steps.expert_imbalance[rec.step] == pytest.approx(imbalance, rel=1e-6)
    # a decode step of one request touches top-k experts per layer, no more
    one = [r for r in records if r.phase == "decode" and r.size == 1]
    assert one and all(steps.experts_touched[r.step] == cfg.num_experts_per_tok for r in one)


def test_a_graphs_padding_tokens_choose_experts_but_are_not_counted():
    """`ForwardContext.route` with the graph runners' mask: the padded rows (zeros) add nothing."""
    ctx = ForwardContext(backend=None)
    ctx.routing = torch.zeros((2, 8), dtype=torch.int32)
    ids = torch.tensor([[0, 3], [3, 5], [7, 1], [7, 2]])  # the last two rows: padding
    ctx.counted = torch.tensor([1, 1, 0, 0], dtype=torch.int32)
    ctx.route(1, ids)
    assert ctx.routing[0].tolist() == [0] * 8
    assert ctx.routing[1].tolist() == [1, 0, 0, 2, 0, 1, 0, 0]
    ctx.counted = None  # eager: every token counts
    ctx.route(0, ids)
    assert ctx.routing[0].tolist() == [1, 1, 1, 2, 0, 1, 0, 2]


def test_the_roofline_reads_the_touched_experts_and_the_dense_weights(moe):
    """By hand from the model's config: the dense weights once (attention, layer 1's MLP,
    routers, norms, the LM head; the embedding is gathered), plus each MoE layer's touched
    experts; two FLOPs per weight per token, an expert's per token routed to it."""
    wb, _ = moe
    cfg, model = wb.engine.model_config, wb.engine.model
    h, v, experts, k = cfg.hidden_size, cfg.vocab_size, cfg.num_experts, cfg.num_experts_per_tok
    expert = 3 * h * cfg.moe_intermediate_size
    block = next(m for m in model.modules() if isinstance(m, SparseMoE))
    assert expert == block.w13[0].numel() + block.w2[0].numel() == cfg.expert_params()
    assert not cfg.tie_word_embeddings
    dense = cfg.num_params() - v * h - len(cfg.moe_layers) * experts * expert
    steps, ledger = wb.history.steps.set_index("step"), wb.history.ledger
    per_pair = 4 * cfg.num_heads * cfg.head_dim * cfg.num_layers
    for rec in wb.history.records:
        rows = ledger[ledger.step == rec.step]
        kv_moved = int((rows.cached_len + rows.extend_len).sum())
        before = rows.cached_len - rows.extend_len
        pairs = sum(e * b + e * (e + 1) // 2 for e, b in zip(rows.extend_len, before))
        touched = int((rec.routing > 0).sum())
        nbytes = (dense + touched * expert) * 4 + kv_moved * cfg.kv_bytes_per_token(4)
        assert steps.bytes_read[rec.step] == nbytes
        routed = rec.num_tokens * k * len(cfg.moe_layers)
        flops = 2 * dense * rec.num_tokens + 2 * expert * routed + pairs * per_pair
        assert steps.flops[rec.step] == flops
        all_experts = len(cfg.moe_layers) * experts * expert * 4
        if touched < len(cfg.moe_layers) * experts:
            assert nbytes < dense * 4 + all_experts + kv_moved * cfg.kv_bytes_per_token(4)
    # without its routing, a step is bounded as if it read every expert
    rec = wb.history.records[-1]
    cost = Roofline.for_model(cfg, 4, H200)
    every = cost.of_step(rec.rows, np.ones((2, experts), dtype=np.int32))
    assert cost.of_step(rec.rows).bytes_read == every.bytes_read
    assert cost.of_step(rec.rows, rec.routing).bound_ms <= every.bound_ms


def test_bench_bounds_a_decode_step_by_the_experts_its_routing_touched(moe):
    """`bench`'s decode step bound and the steps table's bound_ms are one definition: both read
    the experts the step's routing touched; a workload's bound, with no routing to read, those
    its tokens would touch routed uniformly at random (fewer than all at a small batch)."""
    wb, _ = moe
    cfg = wb.engine.model_config
    cost = Roofline.for_model(cfg, 4, H200)
    decodes = [rec for rec in wb.history.records if rec.phase == "decode"]
    assert decodes
    for rec in decodes:
        kv_tokens = sum(r.cached_len for r in rec.rows)
        experts = routed_experts(rec.routing)
        bench = decode_step_bound(cfg, rec.size, kv_tokens, H200, 4, experts=experts) * 1e3
        assert bench == cost.of_step(rec.rows, rec.routing).bound_ms
    # bench's own path: the steps it timed, their median experts, the same bound
    steps = [step_time(rec, 0.01 * i) for i, rec in enumerate(wb.history.records)]
    top = decode_step(steps, cfg, H200)
    at_top = [s for s in steps if s.phase == "decode" and s.batch_size == top.batch_size]
    assert len(at_top) >= 2 and all(s.experts is not None for s in at_top)
    touched = [int((rec.routing > 0).sum()) for rec in decodes if rec.size == top.batch_size]
    assert top.experts_touched * len(cfg.moe_layers) == pytest.approx(np.median(touched[1:]))
    # no routing known: the uniform router's experts, not every expert
    batch, experts, k = 2, cfg.num_experts, cfg.num_experts_per_tok
    uniform = cost.uniform_experts(batch)
    assert uniform.touched == pytest.approx(
        len(cfg.moe_layers) * expected_touched(batch, experts, k)
    )
    assert k * len(cfg.moe_layers) < uniform.touched < experts * len(cfg.moe_layers)
    assert (
        decode_step_bound(cfg, batch, 40, H200, 4) * 1e3
        == cost.of_counts(42, 40, 2, uniform).bound_ms
    )
    assert cost.of_counts(42, 40, 2, uniform).bytes_read < cost.of_counts(42, 40, 2).bytes_read


@pytest.mark.parametrize("suffix", [".parquet", ".json"])
def test_a_saved_moe_run_loads_with_its_routing(moe, tmp_path, suffix):
    from workbench.viz import charts

    wb, _ = moe
    run = load_run(wb.save(tmp_path / f"run{suffix}"))
    for loaded in (run, wb.snapshot()):
        pd.testing.assert_frame_equal(loaded.routing, wb.history.routing, check_exact=True)
        columns = ["step", "experts_touched", "expert_imbalance", "bytes_read", "flops"]
        pd.testing.assert_frame_equal(loaded.steps[columns], wb.history.steps[columns])
        assert charts.BY_NAME["expert_load"].applies(loaded)


def test_the_moe_route_hook_gets_what_the_record_holds_and_costs_nothing_unheard():
    """With record="light" and no hook inside a step, the scheduler calls its probe once a step,
    at the end; a `moe.route` hook is called once a step with the record's counts."""
    llm = LLM(MODEL, max_extend_tokens=16)
    probe = CallsProbe("light", roofline=llm.history.roofline)
    scheduler = Scheduler(llm.engine, probe)
    for i, p in enumerate(PROMPTS):
        scheduler.add_request(llm.encode(p), greedy(3 + i))
    while scheduler.step() is not None:
        pass
    steps = len(probe.history.records)
    assert steps > 3 and probe.calls == ["step_end"] * steps
    assert all(r.routing is not None for r in probe.history.records)

    events = []
    probe.hooks.add("moe.route", events.append)
    probe.restart()
    probe.calls.clear()
    for p in PROMPTS[:3]:
        scheduler.add_request(llm.encode(p), greedy(4))
    while scheduler.step() is not None:
        pass
    records = probe.history.records
    assert probe.calls.count("moe_route") == len(records) == len(events) > 2
    for event, rec in zip(events, records):
        assert event.step == rec.step and event.layers == rec.moe_layers == (0, 2)
        assert np.array_equal(np.array(event.counts), rec.routing)
    llm.close()


_INSIDE = (
    "before_step",
    "schedule_end",
    "cache_insert",
    "cache_evict",
    "batch_prepared",
    "forward_end",
    "sample_end",
    "moe_route",
    "request_finish",
    "step_end",
)


def _spy(name: str):
    def method(self, *args, **kwargs):
        self.calls.append(name)
        return getattr(Probe, name)(self, *args, **kwargs)

    return method


class CallsProbe(Probe):
    """The real probe, keeping the name of every call the scheduler makes into it in a step."""

    calls: list[str]

    def __init__(self, *args, **kwargs) -> None:
        self.calls = []
        super().__init__(*args, **kwargs)


for _name in _INSIDE:
    setattr(CallsProbe, _name, _spy(_name))


def test_a_dense_run_has_nan_moe_columns_an_empty_routing_table_and_no_moe_charts():
    from workbench.viz import charts

    wb = Workbench("tiny-qwen3", max_extend_tokens=16)
    events = []
    wb.hooks.add("moe.route", events.append)
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(3))
    wb.run(progress=False)
    assert not events
    steps = wb.history.steps
    assert steps.experts_touched.isna().all() and steps.expert_imbalance.isna().all()
    assert wb.history.routing.empty and list(wb.history.routing.columns) == [
        "step",
        "layer",
        "expert",
        "tokens",
    ]
    assert all(r.routing is None and r.moe_layers == () for r in wb.history.records)
    assert not charts.BY_NAME["expert_load"].applies(wb.history)
    assert not charts.BY_NAME["experts_touched"].applies(wb.history)
    # a run saved before routing was recorded: no routing table, the same views
    run = wb.snapshot()
    old = RunHistory({n: f for n, f in run.tables().items() if n != "routing"}, run.meta)
    assert old.routing.empty and not charts.BY_NAME["expert_load"].applies(old)


def test_an_moe_runs_views_show_its_expert_load(moe, tmp_path):
    from workbench.viz import charts, write_report

    wb, _ = moe
    history = wb.history
    for name in ("expert_load", "experts_touched"):
        assert charts.BY_NAME[name].applies(history)
    # a fresh workbench of an MoE model shows them before its first step
    assert charts.BY_NAME["expert_load"].applies(Workbench(MODEL).history)
    step = int(history.steps.step.iloc[0])
    spec = charts.BY_NAME["expert_load"].draw(history, step).to_dict()
    data = next(iter(spec["datasets"].values()))
    routing = history.routing[history.routing.step == step]
    assert sorted((d["layer"], d["expert"], d["tokens"]) for d in data) == sorted(
        zip(routing.layer, routing.expert, routing.tokens)
    )
    touched = history.steps.experts_touched.iloc[0]
    assert f"{touched:.1f} experts touched per MoE layer" in " ".join(spec["title"])
    html = write_report(history, tmp_path / "report.html").read_text()
    assert "Experts touched per step" in html and "Tokens per expert at step" in html
    assert "experts touched per MoE layer" in html


@pytest.mark.parametrize(
    "policy, chunk, page, overlap",
    [("prefill_first", 16, 1, False), ("mixed", 32, 2, True), ("decode_first", 24, 1, False)],
)
def test_the_twin_schedules_an_moe_model_step_for_step(policy, chunk, page, overlap):
    settings = dict(max_extend_tokens=chunk, policy=policy, cache="radix", overlap=overlap)
    real = Workbench(MODEL, page_size=page, num_pages=NUM_PAGES // page, **settings)
    requests = workload(seed=chunk + page)
    real_history = run_workload(real, requests, (5, 3))
    costs = moe_costs()
    twin = Workbench(
        MODEL, step_costs=costs, page_size=page, num_pages=NUM_PAGES // page, **settings
    )
    twin_history = run_workload(twin, requests, (5, 3))
    assert_same_schedule(real_history, twin_history)
    # the twin's routing: per MoE layer, the experts uniform routing touches on average (costs
    # fitted on no runs: every token routed independently)
    assert costs.prompt_spread == 1.0
    cfg = twin.engine.model_config
    steps = twin_history.steps
    E, k = cfg.num_experts, cfg.num_experts_per_tok
    for step in steps.itertuples():
        expected = min(max(round(expected_touched(step.num_tokens, E, k)), k), E)
        assert step.experts_touched == expected
    sums = twin_history.routing.groupby(["step", "layer"]).tokens.sum().unstack()
    assert list(sums.columns) == [0, 2]
    tokens = steps.set_index("step").num_tokens
    assert (sums[0] == tokens * k).all() and (sums[2] == tokens * k).all()
    # and its times are the costs' on that routing
    device, _ = costs.predict_steps(steps)
    assert np.allclose(steps.device_ms, device, rtol=0, atol=1e-6)


def moe_costs(experts_ms: float = 0.25):
    """`synthetic_costs` of the MoE model, its device time growing with the experts touched."""
    costs = synthetic_costs(MODEL)
    device = {
        path: Linear(device_features(path, True), (*f.coef, experts_ms))
        for path, f in costs.device.items()
    }
    return dataclasses.replace(costs, device=device)


def test_step_costs_fitted_on_moe_runs_count_the_experts_touched():
    """Real MoE runs timed by a known function that charges each expert touched: the fit finds
    its cost per expert, and a twin on it predicts the steps as the function does."""
    truth = moe_costs(0.4)
    fitted = fit_step_costs(timed_runs(Workbench(MODEL, num_pages=20000), truth))
    eager = fitted.device["eager"]
    assert eager.features == device_features("eager", True) and "experts" in eager.features
    assert np.allclose(eager.coef, truth.device["eager"].coef, rtol=1e-6)
    assert "experts touched per MoE layer" in fitted.summary()
    twin = Workbench(MODEL, step_costs=fitted, max_extend_tokens=512, policy="mixed")
    history = run_workload(twin, workload(seed=6, n=14))
    assert history.steps.experts_touched.notna().all()
    expected, _ = truth.predict_steps(history.steps)
    assert np.allclose(history.steps.device_ms, expected, rtol=0, atol=1e-6)


def test_the_twin_learns_how_prompt_chunks_route():
    """Real MoE runs whose prompt steps touched as many experts as chunks of n tokens routing
    like n ** 0.35 independent tokens (decoding tokens independent) would: the fit finds that
    spread, keeps it through a save, and a twin on it routes its prompt steps so."""
    truth, spread = moe_costs(0.4), 0.35
    cfg = Workbench(MODEL).engine.model_config
    E, k = cfg.num_experts, cfg.num_experts_per_tok
    runs = timed_runs(Workbench(MODEL, num_pages=20000), truth)
    for name, run in runs.items():
        steps = run.steps.copy()
        rows = (steps.batch_size - steps.decode_tokens).to_numpy()
        prompt = (steps.num_tokens - steps.decode_tokens).to_numpy()
        tokens = independent_tokens(steps.decode_tokens.to_numpy(), rows, prompt, spread)
        steps["experts_touched"] = expected_touched(tokens, E, k)
        steps["device_ms"] = truth.predict_steps(steps)[0]
        runs[name] = RunHistory({**run.tables(), "steps": steps}, run.meta)
    assert (runs["mixed"].steps.phase == "mixed").any()  # chunks beside decoding tokens
    fitted = fit_step_costs(runs)
    assert fitted.prompt_spread == pytest.approx(spread, abs=1e-9)
    assert fitted.routing["error_pct"] == pytest.approx(0, abs=1e-6)
    assert StepCosts.from_dict(fitted.to_dict()).routing == fitted.routing
    assert "n ** 0.35 tokens routed independently" in fitted.summary()
    # runs of a model whose configuration is not here: costs all the same, no spread
    elsewhere = {
        n: RunHistory(r.tables(), {**r.meta, "model": "/elsewhere/moe"}) for n, r in runs.items()
    }
    assert fit_step_costs(elsewhere).routing == {}
    twin = Workbench(MODEL, step_costs=fitted, max_extend_tokens=24, policy="mixed")
    steps = run_workload(twin, workload(seed=6, n=14)).steps
    prompt_steps = steps[steps.phase != "decode"]
    assert len(prompt_steps) > 3
    for s in steps.itertuples():
        rows, prompt = s.batch_size - s.decode_tokens, s.num_tokens - s.decode_tokens
        touched = expected_touched(independent_tokens(s.decode_tokens, rows, prompt, spread), E, k)
        assert s.experts_touched == min(max(round(float(touched)), k), E)
    # fewer than independent tokens would touch: the spread is what the twin went by
    assert (
        prompt_steps.experts_touched
        < prompt_steps.num_tokens.map(lambda n: min(max(round(expected_touched(n, E, k)), k), E))
    ).any()


def test_a_spread_needs_prompt_steps_with_routing():
    """Runs without prompt steps that counted experts (a dense model's) fit no spread: 1.0,
    every token routed independently, which `independent_tokens` then counts."""
    from workbench.twin.routing import fit_prompt_spread

    steps = pd.DataFrame(
        dict(phase=["decode", "prefill"], batch_size=[4, 1], decode_tokens=[4, 0],
             num_tokens=[4, 30], experts_touched=[3.0, np.nan])
    )  # fmt: skip
    assert fit_prompt_spread(steps, 8, 2)[:2] == (1.0, 0)
    assert independent_tokens(3, 2, 40, 1.0) == 43


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_on_the_gpu_graphs_count_only_the_batchs_tokens(backend):
    """Decode batches of 3 and 5 run padded to graphs of 4 and 8, prompts padded to a prompt
    graph's shape: the recorded routing counts only the batch's tokens, and equals the routing
    of the same steps replayed without graphs (the same padded shapes run eagerly, where the
    router's inputs can be read)."""
    results = {}
    for captured in (True, False):
        wb = Workbench(
            GPU_MODEL,
            device="cuda",
            cuda_graph=captured,
            cuda_graph_max_tokens=64,
            moe_backend=backend,
            max_extend_tokens=64,
        )
        try:  # (closed whatever fails: the next GPU test needs the memory)
            router = None if captured else RouterInputs(wb.engine.model)
            for i, p in enumerate(PROMPTS):
                wb.add_request(p, greedy(4 + 2 * (i % 2)), arrival_step=0 if i < 3 else 6)
            padded, expected = [], {}
            cfg = wb.engine.model_config
            while (record := wb.step()) is not None:
                routed = record.routing.sum(axis=1)
                assert (routed == record.num_tokens * cfg.num_experts_per_tok).all()
                padded.append(record.padding_tokens)
                if router is not None:
                    expected[record.step] = router.counts(record.num_tokens)
            assert any(padded)  # (the same padded shapes, captured or not)
            assert all(r.cuda_graph == captured for r in wb.history.records)
            results[captured] = {r.step: r.routing for r in wb.history.records}
            for step, counts in expected.items():
                np.testing.assert_array_equal(results[captured][step], counts)
        finally:
            wb.close()
    assert results[True].keys() == results[False].keys()
    for step, counts in results[True].items():
        np.testing.assert_array_equal(counts, results[False][step], err_msg=f"step {step}")


def test_expected_touched_is_uniform_routings_mean():
    assert expected_touched(1, 128, 8) == pytest.approx(8)
    assert expected_touched(0, 128, 8) == 0
    rng = np.random.default_rng(0)
    tokens, draws = 16, 2000
    touched = [
        len({e for _ in range(tokens) for e in rng.choice(128, 8, replace=False)})
        for _ in range(draws)
    ]
    assert np.mean(touched) == pytest.approx(expected_touched(tokens, 128, 8), rel=0.01)
    assert math.isclose(expected_touched(10_000, 128, 8), 128)

"""Each step against its roofline: the cost model of any batch from its ledger rows, the steps
table's columns, and the views that show them (also for runs saved before the columns)."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import torch

from workbench import LLM, Workbench, load_run
from workbench.bench.bound import decode_step_bound, prefill_bound, workload_bound
from workbench.bench.printout import _print_decode_step
from workbench.history.history import TABLES, History, _build_tables
from workbench.history.roofline import (
    H100,
    H200,
    Roofline,
    device_spec,
    expert_weights,
    roofline_spec,
    spec_named,
    streamed_weights,
)
from workbench.runs import RunHistory
from workbench.viz import compare_table, step_breakdown

from .conftest import PROMPTS, greedy

ROOFLINE = ["bytes_read", "flops", "bound_ms", "achieved_gbps"]
LONG = PROMPTS[3] * 3  # about 75 tokens


def mixed_run(**options) -> Workbench:
    """Chunks, full prefills and decodes; with the mixed policy, batches of both."""
    wb = Workbench("tiny-qwen3", max_extend_tokens=16, max_running_reqs=4, **options)
    wb.add_request(LONG, greedy(5))
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(6))
    wb.add_request(PROMPTS[4], greedy(4), arrival_step=4)
    wb.run(progress=False)
    return wb


def with_roofline(history, cost: Roofline | None) -> History:
    """The same records, tabled with another roofline."""
    other = History(cost)
    other.records, other.arrivals, other.aborts = history.records, history.arrivals, history.aborts
    return other


@pytest.fixture(scope="module")
def run() -> Workbench:
    return mixed_run(policy="mixed")


def test_a_cpu_run_moves_bytes_but_has_no_bound(run):
    cost = run.history.roofline
    assert cost.device is None and device_spec("cpu") is None
    cfg = run.engine.model_config
    assert cost == Roofline.for_model(cfg, 4)  # float32 on the CPU
    steps, ledger = run.history.steps, run.history.ledger
    assert {"prefill", "decode", "mixed"} <= set(steps.phase)
    assert steps[["bytes_read", "flops", "achieved_gbps"]].notna().all().all()
    assert steps.bound_ms.isna().all()
    assert (steps.achieved_gbps > 0).all()
    # by hand from the ledger: lengths after the step, so the context read is `cached_len`
    for step in steps.itertuples():
        rows = ledger[ledger.step == step.step]
        kv_moved = (rows.cached_len + rows.extend_len).sum()
        before = rows.cached_len - rows.extend_len
        pairs = sum(e * b + e * (e + 1) // 2 for e, b in zip(rows.extend_len, before))
        assert step.bytes_read == cost.weight_bytes + kv_moved * cfg.kv_bytes_per_token(4)
        per_pair = 4 * cfg.num_heads * cfg.head_dim * cfg.num_layers
        assert step.flops == 2 * streamed_weights(cfg) * step.num_tokens + pairs * per_pair
        achieved = step.bytes_read / step.device_ms / 1e6  # (both rounded in the table)
        assert step.achieved_gbps == pytest.approx(achieved, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("spec", [H200, H100])
def test_every_decode_step_is_bounded_as_decode_step_bound(run, spec):
    cfg = run.engine.model_config
    cost = Roofline.for_model(cfg, 4, spec)
    ledger = run.history.ledger
    decodes = [rec for rec in run.history.records if rec.phase == "decode"]
    assert len(decodes) >= 3 and len({rec.size for rec in decodes}) > 1
    for rec in decodes:
        # the context each request's attention read: its ledger's cached_len after the step
        kv_tokens = int(ledger[ledger.step == rec.step].cached_len.sum())
        assert kv_tokens == sum(r.device_len for r in rec.rows) - rec.size  # (bench's count)
        bound = cost.of_step(rec.rows)
        assert bound.bound_ms == decode_step_bound(cfg, rec.size, kv_tokens, spec, 4) * 1e3
    steps = with_roofline(run.history, cost).steps
    by_step = steps.set_index("step").bound_ms
    for rec in decodes:
        kv_tokens = sum(r.cached_len for r in rec.rows)
        expected = decode_step_bound(cfg, rec.size, kv_tokens, spec, 4) * 1e3
        assert by_step[rec.step] == pytest.approx(expected, abs=1e-6)
    assert steps.bound_ms.notna().all() and (steps.bound_ms > 0).all()


def test_a_chunked_prompt_does_the_work_of_one_prefill_and_reads_the_weights_per_chunk():
    totals = {}
    for budget in (16, 4096):
        wb = Workbench("tiny-llama", max_extend_tokens=budget)
        wb.add_request(LONG, greedy(1))
        wb.run(progress=False)
        steps = wb.history.steps
        totals[budget] = (len(steps), steps.bytes_read.sum(), steps.flops.sum())
    prompt_len = int(wb.history.requests.prompt_tokens[0])
    weight_bytes = wb.history.roofline.weight_bytes
    (chunks, chunked_bytes, chunked_flops), (one, whole_bytes, whole_flops) = totals.values()
    assert one == 1 and chunks == math.ceil(prompt_len / 16) > 1
    # the causal pairs of the chunks add up to those of the whole prompt
    assert chunked_flops == whole_flops
    # the weights once per chunk, and each chunk reads the KV of the chunks before it
    assert chunked_bytes > whole_bytes + (chunks - 1) * weight_bytes


def test_an_moe_prompt_computes_its_tokens_top_k_experts_not_all_of_them():
    """Qwen3-30B-A3B: a prompt token computes the dense weights and 8 of each MoE layer's 128
    experts, so prefilling costs about a tenth of the FLOPs of its 30B weights; the workload's
    bound counts prompts as a prompt step's FLOPs are counted."""
    from workbench.models import ModelConfig, resolve

    cfg = ModelConfig.from_dir(resolve("dummy:qwen3-30b-a3b"))
    lens = [100, 1024]
    active = streamed_weights(cfg) - expert_weights(cfg)
    active += len(cfg.moe_layers) * cfg.num_experts_per_tok * cfg.expert_params()
    pairs = sum(n * (n + 1) // 2 for n in lens)
    flops = 2 * active * sum(lens) + 4 * cfg.num_heads * cfg.head_dim * cfg.num_layers * pairs
    assert prefill_bound(cfg, lens, H200) == pytest.approx(flops / H200.flops, rel=1e-12)
    assert (
        prefill_bound(cfg, lens, H200) < 0.15 * 2 * streamed_weights(cfg) * sum(lens) / H200.flops
    )
    roof = Roofline.for_model(cfg, 2, H200)
    step = sum(roof.of_counts(n, n * (n + 1) // 2, n).flops for n in lens)
    assert prefill_bound(cfg, lens, H200) == pytest.approx(step / H200.flops, rel=1e-12)
    whole = workload_bound(cfg, lens, [1, 1], H200)  # (one token each: no decode step)
    assert whole.decode_steps == 0 and whole.seconds == pytest.approx(flops / H200.flops)


def test_tables_without_a_cost_have_nan_columns_and_with_one_build_step_by_step(run):
    history = run.history
    bare = _build_tables(history.records, history.arrivals, history.aborts)["steps"]
    assert bare[ROOFLINE].isna().all().all()
    assert with_roofline(history, None).steps[ROOFLINE].isna().all().all()
    cost = dataclasses.replace(history.roofline, device=H200)
    live = History(cost)
    live.arrivals, live.aborts = history.arrivals, history.aborts
    for rec in history.records:
        live.append(rec)
        whole = _build_tables(live.records, live.arrivals, live.aborts, cost)
        for name in TABLES:
            pd.testing.assert_frame_equal(live.tables()[name], whole[name], check_exact=True)
    live.roofline = None  # the tables follow a change of roofline
    assert live.steps.bound_ms.isna().all()


def test_a_reconfigured_or_reset_engine_keeps_its_roofline():
    wb = Workbench("tiny-llama")
    cost = wb.scheduler.probe.roofline
    assert cost is not None and wb.history.roofline is cost
    wb.reconfigure(max_extend_tokens=8)
    assert wb.history.roofline is cost
    wb.add_request(PROMPTS[0], greedy(3))
    wb.run(progress=False)
    wb.reset()
    assert wb.history.roofline is cost
    wb.add_request(PROMPTS[1], greedy(3))
    wb.run(progress=False)
    assert wb.history.steps.bytes_read.notna().all() and len(wb.history.steps) > 1


def test_the_step_chart_draws_the_bound_where_the_run_has_one(tmp_path):
    import vl_convert as vlc

    wb = Workbench("tiny-llama", record="full", max_extend_tokens=12, max_running_reqs=3)
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(4))
    wb.run(progress=False)
    bounded = with_roofline(wb.history, dataclasses.replace(wb.history.roofline, device=H200))
    path = wb.save(tmp_path / "run.json")
    loaded = load_run(path)
    old = RunHistory({**loaded.tables(), "steps": loaded.steps.drop(columns=ROOFLINE)}, loaded.meta)
    specs = {}
    for label, history in {"cpu": wb.history, "h200": bounded, "old": old}.items():
        chart = step_breakdown(history, highlight_step=1)
        specs[label] = chart.to_dict()
        assert vlc.vegalite_to_png(chart.to_json())[:8] == b"\x89PNG\r\n\x1a\n", label
    # without a bound (the CPU's NaN, or a file saved before the columns) the chart is as it was
    assert specs["cpu"]["title"] == specs["old"]["title"]
    assert "roofline" not in str(specs["cpu"]["title"])
    assert "bound_ms" not in str(specs["cpu"]) and "bound_ms" not in str(specs["old"])
    assert "black: the roofline bound" in specs["h200"]["title"]
    (bound_layer,) = [
        layer for layer in specs["h200"]["layer"][0]["layer"] if "bound_ms" in str(layer)
    ]
    assert bound_layer["mark"]["type"] == "rule"
    table = compare_table({"cpu": wb.history, "h200": bounded, "old": old}, full=True)
    without = table.loc[["cpu", "old"], ["mean step bound (ms)", "bound / device time"]]
    assert without.isna().all().all()
    assert pd.isna(table.loc["old", "mean achieved GB/s"])  # saved before the column
    assert table.loc["h200", "mean step bound (ms)"] > 0
    assert table.loc["h200", "mean achieved GB/s"] == table.loc["cpu", "mean achieved GB/s"] > 0
    assert (table["p50 ITL (ms)"] > 0).all()


def test_the_bench_draws_its_roofline_for_the_gpu_it_ran_on(capsys):
    """`bench` on an H100 drew the H200's bound (its old default): the GPU's own spec by its
    name now, none for a GPU of neither name unless `--device-spec` names one, none on a CPU."""
    assert spec_named("NVIDIA H100 80GB HBM3") is H100 and spec_named("NVIDIA H200") is H200
    assert spec_named("NVIDIA A100-SXM4-80GB") is None
    assert roofline_spec("cpu") is None and roofline_spec("cpu", "h100") is None
    row = dict(decode_batch=8, decode_step_kv_tokens=800, decode_step_ms=2.0, decode_launch_ms=0.1)
    row |= dict(decode_wait_ms=1.8, decode_collect_ms=0.1, roofline_tokens_per_s=None)
    _print_decode_step({**row, "device": "NVIDIA A100-SXM4-80GB"})
    _print_decode_step({**row, "device": "cpu"})
    known = dict(roofline_device="H100", roofline_tokens_per_s=9000.0, roofline_fraction=0.5)
    _print_decode_step(
        {**row, **known, "device": "NVIDIA H100 80GB HBM3", "decode_step_bound_ms": 1.0}
    )
    out = capsys.readouterr().out.splitlines()
    assert "no roofline for a GPU of no known spec: give --device-spec h200 or h100" in out[0]
    assert "no roofline on the cpu" in out[2]
    assert out[4].startswith("roofline bound (H100) 9,000 tokens/s: achieved 50%")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_known_gpu_no_step_beats_its_bound():
    spec = device_spec("cuda")
    if spec is None:
        pytest.skip(f"no spec for {torch.cuda.get_device_name()}")
    llm = LLM("dummy:qwen3-0.6b", device="cuda", record="light", max_extend_tokens=256)
    assert llm.history.roofline.device == spec
    prompts = [p * 4 for p in PROMPTS] * 8
    llm.generate(prompts, greedy(32))
    steps = llm.history.steps
    assert steps[ROOFLINE].notna().all().all()
    assert (steps.bound_ms < steps.device_ms).all()
    assert (steps.achieved_gbps < spec.bandwidth / 1e9).all()


def test_a_step_split_over_gpus_is_bounded_by_each_ones_share(run):
    """Tensor parallelism: N GPUs each read and compute 1/N of a step, so its bound on
    `spec.times(N)` is 1/N of one GPU's (bytes and FLOPs stay those of the whole step)."""
    cfg = run.engine.model_config
    one, two = Roofline.for_model(cfg, 2, H200), Roofline.for_model(cfg, 2, H200.times(2))
    assert H200.times(1) is H200 and H200.times(2).name == "2 x H200"
    for rec in run.history.records:
        a, b = one.of_step(rec.rows), two.of_step(rec.rows)
        assert (a.bytes_read, a.flops) == (b.bytes_read, b.flops)
        assert b.bound_ms == pytest.approx(a.bound_ms / 2, rel=1e-12)

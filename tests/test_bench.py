"""The command line on the CPU: the benchmark (one run, a sweep, saved runs) and the demo."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.__main__ import main
from workbench.bench.cli import add_arguments
from workbench.bench.sweep import sweep_configs
from workbench.bench.workload import random_workload

SMALL = ["--num-requests", "4", "--input-len", "8", "24", "--output-len", "4", "12"]


def _bench(*extra: str) -> str:
    """What `python -m workbench bench SMALL extra` prints, run in this process (an interpreter
    and its imports cost ~2 s a test; `test_save_without_recording_is_refused` runs the module)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["bench", *SMALL, *extra])
    return out.getvalue()


def test_sweep_runs_every_combination_on_the_same_work():
    results = json.loads(
        _bench("--sweep", "overlap=False,True", "--sweep", "record=off,light", "--json")
    )
    expected = sum(random_workload(4, (8, 24), (4, 12), 0).output_lens)
    assert [r["varied"] for r in results] == [
        {"overlap": False, "record": "off"},
        {"overlap": False, "record": "light"},
        {"overlap": True, "record": "off"},
        {"overlap": True, "record": "light"},
    ]
    assert [(r["overlap"], r["record"]) for r in results] == [
        (v["overlap"], v["record"]) for v in (r["varied"] for r in results)
    ]
    assert all(r["output_tokens"] == expected for r in results)


def test_sweep_prints_a_table_and_passes_engine_options_through():
    out = _bench("--sweep", "max_extend_tokens=8,64", "--sweep", "share_threshold=0")
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table[0].startswith("| max_extend_tokens | share_threshold | output tok/s")
    assert [line.split("|")[1].strip() for line in table[2:]] == ["8", "64"]
    # the small chunk needs more steps than the large one for the same prompts
    steps = [int(line.split("|")[5]) for line in table[2:]]
    assert steps[0] > steps[1]
    assert "ran the same kernels" not in out  # (a schedule, not kernels, was varied)
    # each ran once: the table carries no spread, and says so (and how to get one)
    assert "Each setting ran once: how far apart two runs of one setting fall here is not " in out
    assert "--sweep max_extend_tokens=8,64,8,64 runs each twice" in out


def test_a_setting_swept_twice_gives_the_table_its_run_to_run_spread():
    out = _bench("--model", "tiny-llama", "--sweep", "max_extend_tokens=8,64,8")
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert [line.split("|")[1].strip() for line in table[2:]] == ["8", "64", "8"]  # in order
    tps = [float(line.split("|")[2].replace(",", "")) for line in table[2:]]
    assert not [line for line in out.splitlines() if line.startswith("max_extend_tokens=64 ran")]
    for value, (a, b) in (("8", (tps[0], tps[2])),):
        (note,) = [
            line for line in out.splitlines() if line.startswith(f"max_extend_tokens={value} ran")
        ]
        low, high = min(a, b), max(a, b)
        assert f"ran 2 times: {low:,.0f} to {high:,.0f} output tok/s, " in note
        apart = float(note.split(" output tok/s, ")[1].split("%")[0]) / 100
        # the cells are rounded to whole tok/s: (high - low) / low moves by up to
        # 0.5 (1 + high / low) / low from the runs' own figures, which the note uses
        assert apart == pytest.approx((high - low) / low, abs=0.001 + 0.5 * (1 + high / low) / low)
    assert "Each setting ran once" not in out


def test_a_twins_sweep_says_its_runs_have_no_spread_of_their_own(tmp_path):
    from .test_twin import MODEL as TWIN_MODEL
    from .test_twin import synthetic_costs

    costs = synthetic_costs(TWIN_MODEL).save(tmp_path / "costs.json")
    out = _bench("--model", TWIN_MODEL, "--step-costs", str(costs), "--sweep", "policy=mixed,mixed")
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert len({line.split("|")[2] for line in table[2:]}) == 1  # the same figures, twice
    assert "A twin's runs are simulated on its virtual clock" in out
    assert "ran 2 times" not in out and "Each setting ran once" not in out


def test_a_sweep_of_a_kernel_option_the_device_cannot_take_says_the_runs_ran_alike():
    """On the CPU small_gemm resolves off either way: the table's difference is noise, and the
    line under it says so (`Engine.kernels`)."""
    out = _bench("--sweep", "small_gemm=false,true")
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert [line.split("|")[1].strip() for line in table[2:]] == ["False", "True"]
    (note,) = [line for line in out.splitlines() if "ran the same kernels" in line]
    assert note.startswith("small_gemm=False and small_gemm=True ran the same kernels here (")
    assert "small-batch GEMM off" in note and "not the option's" in note


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA graphs run there")
def test_a_switch_swept_on_that_ran_off_says_so_under_the_table():
    """On the CPU no step replays a CUDA graph: the cuda_graph=True row ran as the False row
    did, and the line under the table says so (the column says what was asked)."""
    out = _bench("--sweep", "cuda_graph=true,false")
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert [line.split("|")[1].strip() for line in table[2:]] == ["True", "False"]
    (note,) = [line for line in out.splitlines() if " ran as " in line]
    assert note.startswith("cuda_graph=True ran as cuda_graph=False here")
    assert "cuda_graph=False ran as" not in out


def test_a_swept_flag_takes_true_and_false_as_a_shell_writes_them():
    from workbench.flags import parse_value

    assert [parse_value(v) for v in ("true", "False", "TRUE", "8", "0.5", "mixed")] == [
        True,
        False,
        True,
        8,
        0.5,
        "mixed",
    ]


@pytest.mark.parametrize("spec", ["overlap", "overlap=", "json=True"])
def test_bad_sweep_is_refused(spec):
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="sweep"):
        sweep_configs(parser.parse_args(["--sweep", spec]))


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("request_rate=2,0", "--sweep request_rate=0: request_rate must be a finite number > 0"),
        ("max_extend_tokens=64,0", "--sweep max_extend_tokens=0: max_extend_tokens must be an"),
        ("num_requests=8,x", "--sweep num_requests=x: num_requests must be an integer >= 1"),
        ("policy=mixed,mixd", "--policy is one of decode_first, mixed, prefill_first"),
        ("overlap=true,maybe", "--overlap/--no-overlap is a switch, swept as true or false"),
        ("dtype=half,float64", "dtype must be auto, "),
    ],
)
def test_a_swept_value_is_refused_as_its_flag_refuses_it(spec, said):
    """Before any run, naming the key, the value and what the flag allows (a swept value
    went to the run as a Python literal: request_rate=0 or policy=mixd reached the engine)."""
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError) as refused:
        sweep_configs(parser.parse_args(["--sweep", spec]))
    assert said in str(refused.value)


def test_a_sweep_takes_a_flags_other_names_and_refuses_vllms_unlike_ours():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = ["--sweep", "chunked-prefill-size=8,64", "--sweep", "num_prompts=4"]
    varied = [run.varied for run in sweep_configs(parser.parse_args(flags))]
    assert varied == [
        {"max_extend_tokens": 8, "num_requests": 4},
        {"max_extend_tokens": 64, "num_requests": 4},
    ]
    twice = ["--sweep", "max_num_batched_tokens=8", "--sweep", "max_extend_tokens=64"]
    with pytest.raises(ValueError, match="--sweep max_extend_tokens is given twice"):
        sweep_configs(parser.parse_args(twice))
    with pytest.raises(ValueError, match="--sweep chunked_prefill_size=0: max_extend_tokens must"):
        sweep_configs(parser.parse_args(["--sweep", "chunked_prefill_size=0"]))
    with pytest.raises(ValueError, match="--sweep gpu_memory_utilization: .*memory_ratio"):
        sweep_configs(parser.parse_args(["--sweep", "gpu_memory_utilization=0.9"]))


def test_swept_values_are_read_as_their_flags_read_them():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = [
        "--sweep",
        "request_rate=inf,2",
        "--sweep",
        "dtype=half,auto",
        "--sweep",
        "fused_rope=1",
    ]
    varied = [run.varied for run in sweep_configs(parser.parse_args(flags))]
    # --request-rate's inf, vLLM's dtype names; an EngineConfig field (no flag) as a literal
    assert varied[0] == {"request_rate": math.inf, "dtype": "float16", "fused_rope": 1}
    assert [v["dtype"] for v in varied] == ["float16", None, "float16", None]
    assert [v["request_rate"] for v in varied] == [math.inf, math.inf, 2.0, 2.0]


def test_saved_sweep_runs_load_and_compare(tmp_path):
    from workbench import load_run
    from workbench.viz import compare_table

    args = ["--sweep", "policy=prefill_first,mixed", "--record", "light", "--save", str(tmp_path)]
    results = json.loads(_bench(*args, "--max-extend-tokens", "8", "--json"))
    runs = {r["varied"]["policy"]: load_run(r["saved"]) for r in results}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "policy=mixed.parquet",
        "policy=prefill_first.parquet",
    ]
    table = compare_table(runs, full=True)
    # the saved history is the timed run alone (the warm-up is not in it)
    assert list(table.steps) == [r["steps"] for r in results]
    assert list(table["output tokens"]) == [r["output_tokens"] for r in results]
    assert runs["mixed"].meta["policy"] == "mixed"
    assert table.loc["mixed", "mixed steps"] > 0


def test_save_without_recording_is_refused(tmp_path):
    cmd = [sys.executable, "-m", "workbench", "bench", *SMALL, "--save", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode != 0 and "--record light or full" in done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "model", ["tiny-llama", pytest.param("smollm2", marks=pytest.mark.slow)]
)  # `make demo`'s own model, SmolLM2, takes a minute on the CPU: with -m slow
def test_demo_runs_and_writes_its_report(tmp_path, model):
    """`make demo`'s command, with the mixed policy and light records to keep it short."""
    from workbench import load_run

    cmd = [sys.executable, "-m", "workbench", "demo", "--out", str(tmp_path), "--model", model]
    cmd += ["--policy", "mixed", "--record", "light"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    assert "KV pool integrity ok" in out and " mixed " in out
    run = load_run(tmp_path / "run.parquet")
    assert run.meta["policy"] == "mixed" and (run.steps.phase == "mixed").any()
    report = (tmp_path / "report.html").read_text()
    assert "mixed steps" in report and "vega-embed" in report  # summary and charts inline
    assert "cdn.jsdelivr" not in report


def test_poisson_arrivals_are_seeded_and_have_the_rate():
    from workbench.bench.online import poisson_arrivals

    times = poisson_arrivals(4000, rate=50.0, seed=1)
    assert times == poisson_arrivals(4000, rate=50.0, seed=1)
    assert times != poisson_arrivals(4000, rate=50.0, seed=2)
    assert all(b > a for a, b in zip(times, times[1:]))
    assert abs(times[-1] / len(times) - 1 / 50) < 0.05 / 50  # mean gap within 5%
    assert poisson_arrivals(3, float("inf")) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(3, 0.0)


def test_serving_arrivals_gives_generates_tokens_and_sane_latencies(tiny_llm):
    from workbench.bench.online import latency_summary, poisson_arrivals, serve

    work = random_workload(8, (8, 40), (3, 9), seed=3)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in work.output_lens]
    expected = [o["token_ids"] for o in tiny_llm.generate(work.prompts, params)]
    arrivals = poisson_arrivals(8, rate=40.0, seed=3)
    tokens: dict[int, list[int]] = {}

    def keep(record) -> None:
        sampled = [r.uid for r in record.rows if r.kind != "chunk"]
        for uid, token in zip(sampled, record.tokens):
            if token is not None:
                tokens.setdefault(uid, []).append(token)

    timings = serve(tiny_llm, work.prompts, params, arrivals, on_step=keep)
    tiny_llm.check_integrity()
    assert [tokens[uid] for uid in sorted(tokens)] == expected  # uids follow arrival order
    assert [t.output_tokens for t in timings] == work.output_lens
    for t, arrival in zip(timings, arrivals):
        assert t.arrival == arrival <= t.first_token <= t.finish
    summary = latency_summary(timings)
    assert 0 < summary["ttft_ms_p50"] <= summary["ttft_ms_p90"] <= summary["ttft_ms_p99"]
    assert summary["tpot_ms_p50"] > 0


def test_bench_with_a_request_rate_reports_latencies():
    r = json.loads(_bench("--request-rate", "50", "--json"))
    assert r["request_rate"] == 50.0
    assert r["output_tokens"] == sum(random_workload(4, (8, 24), (4, 12), 0).output_lens)
    assert 0 < r["ttft_ms_p50"] <= r["ttft_ms_p90"] <= r["ttft_ms_p99"] < r["e2e_ms_p99"]


def test_a_run_whose_requests_arrive_late_says_how_long_it_waits(monkeypatch, capsys):
    """A rate far lower than meant (`--request-rate 1e-9`) would wait silently for ages."""
    from workbench.bench import throughput
    from workbench.bench.online import poisson_arrivals

    _bench("--request-rate", "50")
    assert "arrives" not in capsys.readouterr().err  # within the minute: nothing to say
    monkeypatch.setattr(throughput, "LONG_ARRIVALS_S", 0.0)
    _bench("--request-rate", "50")
    last = poisson_arrivals(4, 50.0, 0)[-1]
    said = f"bench: the last of 4 requests arrives {last:,.1f} s after the start at "
    assert said + "--request-rate 50.0/s; the run waits for it" in capsys.readouterr().err


def test_the_printout_counts_each_phases_steps():
    r = json.loads(_bench("--json"))
    line = next(x for x in _bench().splitlines() if x.startswith("time by phase: "))
    assert 1 in r["phase_steps"].values()  # (its four prompts in one step)
    for phase, n in r["phase_steps"].items():
        assert f"{phase} {n} {'step' if n == 1 else 'steps'} " in line, line


def test_bench_splits_the_hosts_time_per_step():
    r = json.loads(_bench("--json"))
    # on the CPU the forward runs inside launch: nothing is left to wait for at collect
    assert r["decode_launch_ms"] > 0 and r["decode_collect_ms"] >= 0
    assert r["decode_wait_ms"] < 0.1 * r["decode_launch_ms"]


def test_bench_reports_the_steps_with_prompt_tokens():
    """Their count, tokens (a chunk under the budget), forward stage and device time; on the
    CPU the device timer spans the forward stage it contains."""
    r = json.loads(_bench("--json", "--max-extend-tokens", "16"))
    assert r["prompt_steps"] == r["phase_steps"].get("prefill", 0) + r["phase_steps"].get(
        "mixed", 0
    )
    assert 0 < r["prompt_step_tokens"] <= 16
    assert 0 < r["prompt_step_forward_ms"] <= r["prompt_step_device_ms"]
    assert r["prompt_step_graphs"] == 0  # (the CPU captures none)


def test_bench_splits_the_run_by_phase_and_batch_size():
    r = json.loads(_bench("--json", "--num-requests", "12"))
    assert sum(r["phase_steps"].values()) == r["steps"]
    assert r["idle_seconds"] == 0  # (all at once: the engine never waited for an arrival)
    # the phases tile the timed run: step ends from its start to its end
    assert sum(r["phase_seconds"].values()) == pytest.approx(r["seconds"], rel=0.05, abs=0.02)
    steps, seconds = zip(*r["decode_by_batch"].values())
    assert sum(steps) == r["phase_steps"]["decode"]
    assert sum(seconds) == pytest.approx(r["phase_seconds"]["decode"], abs=0.005)
    assert set(r["decode_by_batch"]) <= {"<=16", "<=64", "<=128", "<=192", ">192"}
    assert r["gc_collections"] >= r["gc_full_collections"] >= 0


def test_bench_counts_the_wait_for_arrivals_apart_from_the_steps(tmp_path):
    """Requests arriving slowly: the run waits between them with nothing to step, and that
    time is not charged to the step that follows (it was a prefill's)."""
    result = tmp_path / "result.json"
    out = _bench("--request-rate", "2", "--output-len", "2", "3", "--output-json", str(result))
    r = json.loads(result.read_text())
    assert r["idle_seconds"] > 0.2  # 4 requests at 2/s, each done in a few steps
    stepped = sum(r["phase_seconds"].values())
    assert stepped + r["idle_seconds"] == pytest.approx(r["seconds"], rel=0.05, abs=0.02)
    assert stepped < r["seconds"] - 0.2
    # the throughput printed says whose rate it is when the run mostly waited
    assert "(the arrivals' rate, not the engine's: it waited for them" in out


def test_bench_profile_reads_the_probes_profiled_steps(tmp_path):
    """`--profile` profiles decode steps of a full batch through the engine's own probe
    (record="full" and a window of those steps), and its families are the history's."""
    trace = tmp_path / "trace.json"
    out = _bench(
        "--max-num-seqs",
        "4",
        "--profile",
        "--profile-batches",
        "2,4",
        "--profile-trace",
        str(trace),
    )
    assert "10 decode steps of 4 requests, profiled (record=full)" in out
    assert "the arrivals' rate" not in out  # (all at once: the engine's own)
    head, operators = out.split("the busiest operators, ms and launches per step\n")
    assert "aten::mm" in operators.split("ms per decode step by family")[0]
    # the operators a step in all, at least those of the busiest listed
    per_step = int(head.rsplit("(record=full), ", 1)[1].split(" operators a step")[0])
    listed = operators.split("ms per decode step by family")[0].strip().splitlines()
    launches = sum(float(line.split()[2].rstrip("x")) for line in listed)
    assert per_step >= launches - 0.5 * len(listed) > 0
    families = dict(
        part.rsplit(" ", 1)
        for part in out.split("ms per decode step by family: ")[1].splitlines()[0].split(", ")
    )
    assert float(families["matmul"]) > 0 and "idle" in families
    assert "device busy" in out
    marks = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert marks  # the profiled run's steps and events


def test_a_profile_restores_the_record_level_and_window():
    from workbench import LLM
    from workbench.bench.profile import profile_decode_steps

    llm = LLM("tiny-qwen3", max_running_reqs=4, record="light", profile_steps=range(3))
    profile = profile_decode_steps(llm, 4, 3, (8, 16), seed=0)
    assert profile.count == 3 and set(profile.steps.phase) == {"decode"}
    assert set(profile.steps.batch_size) == {4} and profile.steps.profiled.all()
    assert set(profile.events.step) <= set(profile.steps.step)
    assert llm.record == "light" and llm.scheduler.probe.window.steps == range(3)
    llm.check_integrity()


def _parse(args: list[str]):
    import argparse

    from workbench.bench.cli import resolve_lengths

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = parser.parse_args(args)
    resolve_lengths(parsed)
    return {k: v for k, v in vars(parsed).items() if not k.startswith("random_")}


def test_vllm_and_sglang_flag_names_mean_ours():
    theirs = _parse(
        ["--num-prompts", "3", "--random-input-len", "20", "--random-output-len", "6"]
        + ["--random-range-ratio", "0.5", "--chunked-prefill-size", "16"]
        + ["--max-running-requests", "2", "--disable-radix-cache", "--disable-cuda-graph"]
        + ["--disable-overlap-schedule"]
    )
    ours = _parse(
        ["--num-requests", "3", "--input-len", "10", "30", "--output-len", "3", "9"]
        + ["--max-extend-tokens", "16", "--max-running-reqs", "2", "--cache", "naive"]
        + ["--no-cuda-graph", "--no-overlap"]
    )
    assert theirs == ours
    assert _parse(["--random-input-len", "64"])["input_len"] == [64, 64]  # ratio 0: exactly N


def test_every_flag_says_its_default():
    from workbench.__main__ import main

    for command in ("bench", "demo"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
    out = subprocess.run(
        [sys.executable, "-m", "workbench", "bench", "--help"], capture_output=True, text=True
    ).stdout
    for needle in (
        "(default: 16384)",
        "(default: prefill_first)",
        "(default: radix)",
        "(default: 0.6)",
        "(default: on)",
        "uniform in [MIN, MAX]",
    ):
        assert needle in out, needle


def test_bench_under_vllm_names_writes_its_results(tmp_path):
    path = tmp_path / "result.json"
    cmd = (
        [sys.executable, "-m", "workbench", "bench", "--num-prompts", "3"]
        + ["--random-input-len", "16", "--random-output-len", "4", "--policy", "mixed"]
        + ["--chunked-prefill-size", "8", "--disable-radix-cache"]
        + ["--output-file", str(path)]
    )
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    result = json.loads(path.read_text())
    assert (result["policy"], result["max_extend_tokens"], result["cache"]) == ("mixed", 8, "naive")
    assert result["num_requests"] == 3 and result["output_tokens"] == 12
    assert result["input_len"] == [16, 16]
    # the kernels as the engine resolved them, as a saved run says them (`Engine.kernels`)
    assert result["kernels"]["attention"] == "torch" and result["kernels"]["pdl"] is False


def test_record_cost_says_where_full_recordings_time_went(capsys):
    """`record_cost --workload arriving`: both levels' whole runs, each level's time by phase
    and host stage, and full's profiler sessions; the steps span no more than the run."""
    import re

    record_cost = _benchmark("record_cost")
    record_cost.main(
        ["--workload", "arriving", "--model", "tiny-qwen3", "--requests", "3", "--repeat", "1"]
    )
    out = capsys.readouterr().out
    assert "medians of 1 rounds (under 3: a median is then a mean" in out
    for level in ("light", "full"):
        assert f"record={level:<5} whole run" in out
        (line,) = [line for line in out.splitlines() if line.startswith(f"{level}: ")]
        outside = float(re.search(r"outside it (-?\d+) ms", line).group(1))
        assert outside >= -1  # the first launch to the last collect lies inside the run
        assert "host ms by stage: schedule" in line and "record" in line
    stopped = re.search(r"stopping (\d+\.\d+) s, reading (\d+\.\d+) s .*kept: (\d+) ", out)
    assert stopped and float(stopped.group(1)) > 0  # full stopped a profiler session
    assert float(stopped.group(2)) > 0 and int(stopped.group(3)) > 0  # and read its events
    # reading's parts: kineto's list, our pass over it, giving the kept ones to their steps
    parts = re.search(r"list (\d+\.\d+) s, our pass (\d+\.\d+) s, to steps (-?\d+\.\d+) s", out)
    listed, passed, to_steps = map(float, parts.groups())
    assert listed > 0 and passed > 0 and to_steps >= 0
    assert listed + passed + to_steps == pytest.approx(float(stopped.group(2)), abs=0.002)
    assert record_cost.SessionEvents.fill.__name__ == "fill"  # its timing wrapper is gone
    assert out.count("  full step ") == 5


@pytest.mark.slow  # a benchmark's own count (~10 s); the server's tokens are test_serve.py's
def test_serve_load_counts_every_token_its_clients_received():
    """The load generator's own count: every requested token arrives, through raw streams and
    through the real `openai` client over two processes, at least one token an event (the
    server sends what a stream has when its writer gets to it)."""
    pytest.importorskip("openai")
    serve_load = _benchmark("serve_load")
    llm = LLM("tiny-qwen3", max_running_reqs=4, record="light")
    requests = serve_load.workload(6, 256, (4, 12), (3, 9))
    try:
        served = {
            kind: serve_load.run_served(llm, requests, clients=4, processes=2, kind=kind)
            for kind in ("raw", "openai")
        }
        llm.check_integrity()
    finally:
        llm.close()
    for kind, run in served.items():
        assert run["tokens"] == sum(n for _, n in requests), kind
        assert run["tokens_per_event"] >= 1.0, kind
        assert 0 < run["ttft_ms"][0] <= run["ttft_ms"][2], kind
        assert 0 <= run["itl_ms"][0] <= run["itl_ms"][1] <= run["itl_ms"][2], kind
        assert run["steps"] > 0 and run["cpu_s"]["clients"] > 0, kind


def test_no_benchmark_hides_an_installed_package():
    """`python benchmarks/x.py` puts `benchmarks/` first on `sys.path`: a script named as an
    installed package hides it from every import (`benchmarks/kernels.py` hid the `kernels`
    package transformers imports, and serve_load.py and trace_twin.py failed to start)."""
    import importlib.util

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    hiding = [p.stem for p in folder.glob("*.py") if importlib.util.find_spec(p.stem) is not None]
    assert hiding == []


def _benchmark(name: str):
    """A script of the top-level `benchmarks/` (not in the package), imported from its file. Its
    folder is on `sys.path` only while it loads (its scripts import each other by name), and
    what it loaded from there leaves `sys.modules` after (a script's name must not hide an
    installed package's: `test_no_benchmark_hides_an_installed_package`)."""
    import importlib.util

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    before = set(sys.modules)
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
        for loaded in set(sys.modules) - before:
            origin = getattr(sys.modules[loaded], "__file__", None)
            if origin and Path(origin).parent == folder:
                del sys.modules[loaded]
    return module


def test_the_split_table_sets_the_profiled_steps_device_time_beside_the_timed_ones():
    """Recording every kernel changes the device's time (on an H100 a batch-8 step on cuBLAS:
    2.56 ms profiled against 1.70 timed unprofiled): the family line says both."""
    from workbench.bench.host import HostSplit, split_table
    from workbench.clocks import HOST_STAGES

    families = {"attention": 0.5, "between kernels": 0.96, "matmul": 0.75, "idle": 0.01}
    split = HostSplit(8, 1.71, 0.507, 1.70, 0.69, 0.97, dict.fromkeys(HOST_STAGES, 0.0))
    text = split_table([split._replace(families=families, kernels=[], launches=326)])
    assert "(326 kernels; profiled 2.210 ms on the device, against 1.700 above)" in text


def test_the_gaps_between_kernels_are_a_steps_own():
    """A gap is between two kernels of one step, counted from where the kernels before it
    ended, and named after the kernel that ended there: the profiled steps need not follow one
    another, and the time from one step's kernels to the next's is not the step's. Summed by
    the kernel they follow, per step, they say which kernel's gaps recur. (On an H100 the
    largest gap listed was once 8,041 us in steps of 7.6 ms: kernels had gone to steps by their
    own times, `test_recorded_gpu_kernels_go_to_the_step_that_launched_them`.)"""
    import pandas as pd

    from workbench.bench.profile import DecodeProfile

    steps = pd.DataFrame({"step": [5, 9], "span_ms": [1.0, 1.0], "device_ms": [0.9, 0.9]})
    steps["idle_ms"] = steps.span_ms - steps.device_ms
    kernels = [  # (step, name, start, duration): in step 5 a 30 us gap, in step 9 two of 10
        (5, "a", 0.0, 100.0),
        (5, "b", 50.0, 40.0),  # inside the time of "a": the gap before "c" is from "a"'s end
        (5, "c", 130.0, 100.0),
        (9, "a", 4000.0, 100.0),
        (9, "e", 4110.0, 100.0),
        (9, "d", 4220.0, 5.0),
    ]
    events = pd.DataFrame(kernels, columns=["step", "name", "start_us", "duration_us"])
    events["category"] = "kernel"
    lines = DecodeProfile(8, steps, events, pd.DataFrame()).idle_lines()
    assert lines[1] == "gaps between kernels 0.025 ms per step, 3 gaps (1 over 20 us)"
    assert lines[2].split(" us after ")[0].split() == ["gap", "30.0"]
    assert "after 'a' before 'c'" in lines[2]
    families = pd.DataFrame(  # the family: each step's device time less its kernels'
        {"step": [5, 9], "family": "between kernels", "ms": [0.05, 0.03]}
    )
    with_families = DecodeProfile(8, steps, events, families).idle_lines()
    assert with_families[1].endswith(
        "of the family's 0.040 ms \"between kernels\", 0.015 lie before the step's first kernel "
        "or after its last"
    )
    fewer = families.assign(ms=[0.01, 0.01])  # CUDA events can time a step under its kernels
    line = DecodeProfile(8, steps, events, fewer).idle_lines()[1]
    assert line.endswith(
        "of the family's 0.010 ms \"between kernels\", none: the step's device time (its CUDA "
        "events) is 0.015 ms short of its kernels' span"
    )
    by_kernel = lines[lines.index("gaps by the kernel they follow, us and gaps per step:") + 1 :]
    assert [line.split() for line in by_kernel] == [
        ["20.0", "us", "in", "1.0", "gaps", "after", "'a'"],
        ["5.0", "us", "in", "0.5", "gaps", "after", "'e'"],
    ]


def test_the_settings_line_names_the_attention_that_runs():
    """On the CPU decode attention is the torch backend's whatever `decode_kernel` says (it
    chooses between FlashInfer's and the Triton kernel on the FlashInfer backend)."""
    import torch

    from workbench.config import EngineConfig

    out = _bench()
    settings = next(line for line in out.splitlines() if line.startswith("workbench bench: "))
    runs = EngineConfig(model="tiny-qwen3").decode_attention  # on this machine's device
    assert runs == "torch" or torch.cuda.is_available()
    assert f"decode attention {runs}, " in settings

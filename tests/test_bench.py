"""The command line on the CPU: the benchmark (one run, a sweep, saved runs) and the demo."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbench.bench.throughput import add_arguments, sweep_configs
from workbench.bench.workload import random_workload

SMALL = ["--num-requests", "4", "--input-len", "8", "24", "--output-len", "4", "12"]


def _bench(*extra: str) -> str:
    cmd = [sys.executable, "-m", "workbench", "bench", *SMALL, *extra]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


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


@pytest.mark.parametrize("spec", ["overlap", "overlap=", "json=True"])
def test_bad_sweep_is_refused(spec):
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="sweep"):
        sweep_configs(parser.parse_args(["--sweep", spec]))


def test_saved_sweep_runs_load_and_compare(tmp_path):
    from workbench import load_run
    from workbench.viz import compare_table

    args = ["--sweep", "policy=prefill_first,mixed", "--record", "light", "--save", str(tmp_path)]
    results = json.loads(_bench(*args, "--max-extend-tokens", "8", "--json"))
    runs = {r["varied"]["policy"]: load_run(r["saved"]) for r in results}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "policy=mixed.json",
        "policy=prefill_first.json",
    ]
    table = compare_table(runs)
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


def test_demo_runs_and_writes_its_report(tmp_path):
    """`make demo`'s command, with the mixed policy and light records to keep it short."""
    from workbench import load_run

    cmd = [sys.executable, "-m", "workbench", "demo", "--out", str(tmp_path)]
    cmd += ["--policy", "mixed", "--record", "light"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    assert "KV pool integrity ok" in out and " mixed " in out
    run = load_run(tmp_path / "run.json")
    assert run.meta["policy"] == "mixed" and (run.steps.phase == "mixed").any()
    report = (tmp_path / "report.html").read_text()
    assert "mixed steps" in report and "vega-embed" in report  # summary and charts inline
    assert "cdn.jsdelivr" not in report

"""The benchmark command on the CPU: one run, and a sweep over settings in one process."""

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

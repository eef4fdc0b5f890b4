"""The package as a user installs it: a wheel, installed into a fresh virtual environment
outside the checkout, finds its data (model configs, demo prompts) and runs."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import random, workbench
from workbench import LLM, SamplingParams
from workbench.models import names
from workbench.models.induction import pattern_continuation, pattern_prompts
print("package:", workbench.__file__)
assert {"dummy:qwen3-0.6b", "dummy:qwen3-induction", "dummy:tiny-induction"} <= set(names())
prompt = pattern_prompts(random.Random(0), [30], period=7)[0]
llm = LLM("dummy:tiny-induction", device="cpu", num_pages=256, max_running_reqs=2)
out = llm.generate([prompt], SamplingParams(max_tokens=6))[0]["token_ids"]
assert out == pattern_continuation(prompt, 6), out
print("dummy model ok")
"""


def run(args: list, cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.slow  # builds and installs a wheel in a fresh venv (~45 s): a release check
def test_the_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", "dist"], tmp_path
    )
    (wheel,) = (tmp_path / "dist").glob("workbench-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(run([python, "-c", purelib], tmp_path).strip())
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel]
    run(pip, tmp_path)
    # NOTE: the dependencies (torch, transformers, ...) come from this environment's
    # site-packages as a plain path: its .pth files, the checkout's editable install among
    # them, are not read from there, so `workbench` can only come from the wheel.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    probe = run([python, "-c", PROBE], tmp_path)
    assert f"package: {site}" in probe and "dummy model ok" in probe
    flags = ["--model", "tiny-llama", "--record", "light", "--out", "demo"]
    demo = run([python, "-m", "workbench", "demo", *flags], tmp_path)
    assert "KV pool integrity ok" in demo
    assert (tmp_path / "demo" / "report.html").exists()

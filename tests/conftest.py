"""Shared helpers: Hugging Face references (cached per process) and a run that keeps its steps."""

from __future__ import annotations

import functools
import os
import random

# NOTE: before Triton is imported: the floating-point contraction every Triton before 3.10 uses
# (the GPU machine's 3.6 among them), so the sm_90 compile checks build what runs there; Triton 3.9
# warns while this is unset, and 3.10 turns it off by default
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from workbench import LLM, SamplingParams
from workbench.config import default_page_size
from workbench.models import resolve
from workbench.scheduler.record import StepRecord

# NOTE: with the suite split over processes (pytest-xdist, `make test`), each takes one core's
# worth of threads: torch's default (every core) in each would make them fight for the same two
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def _one_tokenizer_a_folder(load):
    """`AutoTokenizer.from_pretrained` loading each model folder's tokenizer once a process: the
    tests build about 450 engines over `make test`, every one with SmolLM2's tokenizer.json (3.5
    MB), whose loading took 0.2 of the 0.35 s a tiny model's `LLM(...)` took here (2026-12-07).
    No test changes a tokenizer; one asked for with other arguments (a GGUF file) is loaded."""
    loaded = {}

    def from_pretrained(path, *args, **kwargs):
        if args or kwargs:
            return load(path, *args, **kwargs)
        if str(path) not in loaded:
            loaded[str(path)] = load(path)
        return loaded[str(path)]

    return staticmethod(from_pretrained)


transformers.AutoTokenizer.from_pretrained = _one_tokenizer_a_folder(
    transformers.AutoTokenizer.from_pretrained
)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With WORKBENCH_TRACEBACK_NOW=1 (`make gpu-check` sets it), a failure's traceback as it
    happens: pytest prints them only in its summary, which a run cut off at the GPU machine's
    time limit never reaches."""
    if report.failed and os.environ.get("WORKBENCH_TRACEBACK_NOW") == "1":
        print(f"\n{report.nodeid} failed ({report.when}):\n{report.longreprtext}", flush=True)


# `make test` hands whole modules to two workers in collection order (`--dist loadfile`): the
# longest go first, so that what runs last while the other worker idles is short (longest first
# by their summed durations in make test's tier, pytest --durations=0, 2026-12-07 evening: 73 s
# for the server's, 67 to 14 s for the rest; every module not named keeps its place after them)
LONGEST_FIRST = (
    "test_serve.py",
    "test_bench.py",
    "test_browser.py",
    "test_penalties.py",
    "test_hf_equality.py",
    "test_step_failure.py",
    "test_tp.py",
    "test_compare.py",
    "test_moe_models.py",
    "test_profiling.py",
    "test_views.py",
    "test_policies.py",
    "test_cli_names.py",
    "test_profile_window.py",
    "test_padded_steps.py",
    "test_small_gemm.py",
    "test_twin.py",
    "test_race_sampling.py",
    "test_induction.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a module stays whole


# Different lengths on purpose: batches mix short and long prompts.
PROMPTS = [
    "Hello, my name is",
    "The capital of France is a city that",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who "
    "went out every morning before dawn",
    "1, 2, 3, 4,",
]


@functools.cache
def hf_model(name: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve(name), dtype=torch.float32).eval()


def hf_generate(name: str, ids, max_new: int, ignore_eos: bool = True, **options) -> list[int]:
    """Hugging Face `generate` on one prompt (no padding), greedy, float32: its new tokens;
    `options`: more of `generate`'s arguments (a repetition penalty, logits processors)."""
    extra = {"min_new_tokens": max_new} if ignore_eos else {}
    with torch.inference_mode():
        out = hf_model(name).generate(
            torch.tensor([list(ids)]), max_new_tokens=max_new, do_sample=False, **extra, **options
        )
    return out[0, len(ids) :].tolist()


@functools.cache
def _hf_greedy_one(name: str, ids: tuple[int, ...], max_new: int, ignore_eos: bool) -> list[int]:
    return hf_generate(name, ids, max_new, ignore_eos)


def hf_greedy(
    name: str, prompts_ids: list[list[int]], max_new: int, ignore_eos=True
) -> list[list[int]]:
    """Hugging Face `generate`, one prompt at a time (no padding), greedy, float32."""
    return [_hf_greedy_one(name, tuple(ids), max_new, ignore_eos) for ids in prompts_ids]


def run(llm: LLM, prompts, sampling) -> tuple[list[dict], list[StepRecord]]:
    """Generate, keep every step's record, and check the KV pool afterwards."""
    steps: list[StepRecord] = []
    outputs = llm.generate(prompts, sampling, on_step=steps.append)
    llm.check_integrity()
    assert llm.scheduler.is_idle
    return outputs, steps


def prefill_logits(llm: LLM, prompts) -> torch.Tensor:
    """The logits the engine's model returns for each prompt's last position (one prefill per
    prompt, `max_tokens=1`), in prompt order, as float32: read from the real forward."""
    # NOTE: the engine's forward, not a module hook: a CUDA graph's replay runs no hooks
    engine, captured = llm.engine, []
    forward = engine.forward
    engine.forward = lambda batch: captured.append(forward(batch).clone()) or captured[-1]
    try:
        llm.generate(prompts, SamplingParams(max_tokens=1))
    finally:
        del engine.forward
    return torch.cat(captured).float()


_SHARED: dict[tuple, object] = {}


def shared(factory, *key):
    """One engine (LLM or Workbench) per key, kept while the tests that follow ask for the same
    key: settings that belong to the scheduler are then `reconfigure`d on it instead of loading
    the model again (a fresh engine and a reconfigured one schedule alike: empty prefix cache,
    step 0). Only the last is kept: each holds its KV pool."""
    if key not in _SHARED:
        for old in _SHARED.values():
            old.close()
        _SHARED.clear()
        _SHARED[key] = factory()
    return _SHARED[key]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


# The planted induction model (its answers are known), per device: on the GPU Qwen3-0.6B's shapes
# (the kernels' real head size), on the CPU the same planted heads at a quarter of the width and
# half the layers, which answer the same patterns (float32) three to four times faster.
INDUCTION = {"cpu": "dummy:tiny-induction", "cuda": "dummy:qwen3-induction"}

# Tests that run on the CPU and, with `pytest -m gpu` on a CUDA machine, on the GPU too.
CPU_AND_GPU = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]


@pytest.fixture(scope="session")
def tiny_llm() -> LLM:
    return LLM("tiny-llama", max_running_reqs=8)


# The GPU engine tests (test_gpu_numerics.py, test_gpu_overlap_graphs.py, test_gpu_memory.py): run
# on the GPU machine (`pytest -m gpu`); they print numbers (run with -s) for the notes to quote.
MODEL = "dummy:qwen3-0.6b"
KV_TOKENS = 40_000  # each GPU test engine's pool, explicit (4.6 GB), so several fit side by side


def kv_pages(page_size: int | None = None) -> int:
    """`num_pages` for a pool of KV_TOKENS tokens in pages of `page_size` (None: the GPU's
    default, 16: a count of pages meant for page 1 would take 16 times the memory)."""
    return KV_TOKENS // (page_size or default_page_size("cuda"))


def random_prompts(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def make_llm(**options) -> LLM:
    options.setdefault("num_pages", kv_pages(options.get("page_size")))
    options.setdefault("max_running_reqs", 64)
    options.setdefault("cuda_graph_max_bs", 64)
    return LLM(MODEL, **options)

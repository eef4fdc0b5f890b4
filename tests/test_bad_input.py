"""Bad input: a TypeError or ValueError naming the parameter, the value and what is allowed,
raised before any resource is taken; the same LLM keeps working afterwards. And odd but valid
input (numpy and torch token ids, a 2-d array as a batch) is accepted and runs right."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch

from workbench import LLM, SamplingParams, Workbench
from workbench.config import EngineConfig

from .conftest import greedy, hf_greedy, run


@pytest.fixture(scope="module")
def llm() -> LLM:
    # a short context and a small pool, so both limits are easy to cross
    return LLM("tiny-llama", max_seq_len=64, num_pages=40, max_running_reqs=4)


def state(llm: LLM) -> tuple:
    """Everything a request could take: queue, running set, slots, free and cached KV."""
    sched = llm.scheduler
    cache = sched.cache
    return (
        len(sched.prefill.queue),
        len(sched.decode.running),
        sched.table.available_size,
        cache.free_size,
        cache.prefix_cache.size,
        cache.in_use_size,
        len(sched.finished),
    )


def assert_still_serves(llm: LLM) -> None:
    prompt = llm.encode("The capital of France is")
    outputs, _ = run(llm, [prompt], greedy(5))
    assert outputs[0]["token_ids"] == hf_greedy("tiny-llama", [prompt], 5)[0]


@pytest.mark.parametrize(
    ("prompts", "sampling", "error", "message"),
    [
        ([""], None, ValueError, "prompt 0 is empty"),
        ([[]], None, ValueError, "prompt 0 is empty"),
        (["fine", ""], None, ValueError, "prompt 1 is empty"),
        ([list(range(60))], greedy(10), ValueError, "longer than the context of 64"),
        ([list(range(30))], greedy(20), ValueError, "more than the KV pool can ever hold"),
        ([[1, 2, -1]], None, ValueError, "outside the vocabulary"),
        ([[1, 49152]], None, ValueError, "outside the vocabulary"),
        (["a", "b"], [greedy(2)], ValueError, "2 prompts but 1 sampling params"),
        (["a"], {"max_tokens": 3}, TypeError, "sampling must be a SamplingParams"),
        (["a"], 5, TypeError, "sampling must be a SamplingParams.*got 5"),
        (None, None, TypeError, "prompts must be .*got None"),
        ({"a": 1}, None, TypeError, "prompts must be .*dict"),
        ([None], None, TypeError, "prompt 0 must be a string or token ids.*None"),
        ([[True, False, True]], None, TypeError, "prompt 0 must hold integer token ids; item 0"),
        ([[1, 2.0]], None, TypeError, "item 1 is 2.0"),
        ([1, 2.0], None, TypeError, "item 1 is 2.0"),
        ([1, "a"], None, TypeError, r"prompts mixes token ids with other things, got \[1, 'a'\]"),
        ([b"hello"], None, TypeError, "prompt 0 must be a string or token ids.*bytes"),
        ([{3, 4, 5}], None, TypeError, "prompt 0 must be a string or token ids.*set"),
        ([np.array([1.0, 2.0])], None, TypeError, "1-d array of integer token ids"),
        ([np.array([True, False])], None, TypeError, "1-d array of integer token ids"),
        (np.ones((2, 2, 2), dtype=np.int64), None, TypeError, "1-d or 2-d"),
        (["a\ud800b"], None, ValueError, "prompt 0 is not valid text"),
    ],
)
def test_bad_request_is_refused_before_taking_anything(llm, prompts, sampling, error, message):
    before = state(llm)
    with pytest.raises(error, match=message):
        llm.generate(prompts, sampling)
    assert state(llm) == before
    llm.check_integrity()
    assert_still_serves(llm)


def test_text_a_model_cannot_embed_is_refused_before_taking_anything():
    """A model whose tokenizer has more tokens than its embedding (tiny-fast: 2,048 rows,
    SmolLM2's 49,152 tokens): text that encodes past it is refused by name, where it used to
    reach the forward and end the step in an IndexError; token ids it holds are served."""
    llm = LLM("tiny-fast", max_running_reqs=2)
    before = state(llm)
    with pytest.raises(ValueError, match=r"prompt 0's text encodes to token ids outside the "):
        llm.generate(["The capital of France is"], greedy(3))
    assert state(llm) == before
    out = llm.generate([[5, 6, 7, 8]], greedy(3))
    assert len(out[0]["token_ids"]) == 3
    llm.check_integrity()


def test_a_bad_on_step_is_refused_before_anything_is_queued(llm):
    before = state(llm)
    with pytest.raises(TypeError, match="on_step must be a function or None, got 123"):
        llm.generate(["hello"], greedy(3), on_step=123)
    assert state(llm) == before
    assert_still_serves(llm)


def test_an_on_step_that_raises_ends_the_call_and_frees_it(llm):
    """A callback that fails after the first step: the call's requests are gone, nothing is
    left running, and the next call is served."""

    def boom(record):
        raise KeyError("on purpose")

    before = state(llm)
    with pytest.raises(KeyError, match="on purpose"):
        llm.generate(["hello there", "and more"], greedy(6), on_step=boom)
    assert state(llm)[:3] == before[:3] and llm.scheduler.is_idle
    assert not llm.scheduler.finished
    llm.check_integrity()
    assert_still_serves(llm)


def test_token_ids_as_numpy_and_torch(llm):
    """Integer scalars and 1-d integer arrays are token ids; a 2-d array is a batch."""
    ids = [llm.encode(p) for p in ("Hello, my name is", "The sky is blue and")]
    expected = hf_greedy("tiny-llama", ids, 4)
    width = min(map(len, ids))
    square = [p[:width] for p in ids]
    forms = {
        "numpy ints": [[np.int64(t) for t in p] for p in ids],
        "numpy arrays": [np.array(p, dtype=np.int32) for p in ids],
        "torch tensors": [torch.tensor(p) for p in ids],
        "torch scalars": [[torch.tensor(t) for t in p] for p in ids],
    }
    for name, prompts in forms.items():
        outputs, _ = run(llm, prompts, greedy(4))
        assert [o["token_ids"] for o in outputs] == expected, name
    batch_expected = hf_greedy("tiny-llama", square, 4)
    for batch in (np.array(square), torch.tensor(square)):
        outputs, _ = run(llm, batch, greedy(4))
        assert [o["token_ids"] for o in outputs] == batch_expected
    one, _ = run(llm, np.array(ids[0]), greedy(4))  # a 1-d array is one prompt
    assert [o["token_ids"] for o in one] == expected[:1]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(max_tokens=0), ValueError, "max_tokens must be an integer >= 1, got 0"),
        (dict(max_tokens=-3), ValueError, "max_tokens"),
        (dict(max_tokens=True), TypeError, "max_tokens must be an integer >= 1, got True"),
        (dict(max_tokens=2.0), TypeError, "max_tokens must be an integer"),
        (dict(temperature=-0.1), ValueError, "temperature must be .* 0 .greedy. or from 1e-05"),
        (dict(temperature=float("nan")), ValueError, "temperature"),
        (dict(temperature=float("inf")), ValueError, "temperature"),
        (dict(temperature=1e300), ValueError, "temperature must be .* to 3.403e\\+38"),
        (dict(temperature=np.float64(4e38)), ValueError, "the largest float32"),
        (dict(temperature=1e-300), ValueError, "temperature must be 0 .* or at least 1e-05"),
        (dict(temperature="0.7"), TypeError, "temperature must be a number"),
        (dict(top_p=0.0), ValueError, r"top_p must be a finite number in \(0.0, 1.0\]"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(top_k=0), ValueError, "top_k must be -1"),
        (dict(top_k=10**20), ValueError, "top_k must be -1 .off. or .* 1 to 2147483647"),
        (dict(top_k=5.0), TypeError, "top_k must be an integer"),
        (dict(temperature=0.7, seed=1.5), TypeError, "seed must be an integer"),
        (dict(temperature=0.7, seed="a"), TypeError, "seed must be an integer"),
        (dict(seed=-1), ValueError, "seed must be an integer in"),
        (dict(ignore_eos="no"), TypeError, "ignore_eos must be True or False, got 'no'"),
    ],
)
def test_bad_sampling_values(llm, kwargs, error, message):
    with pytest.raises(error, match=message):
        SamplingParams(**kwargs)
    assert_still_serves(llm)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(page_size=3), ValueError, "page_size must be a power of two"),
        (dict(page_size=0), ValueError, "page_size must be an integer in"),
        (dict(page_size=16.0), TypeError, "page_size must be an integer"),
        (dict(max_extend_tokens=0), ValueError, "max_extend_tokens"),
        (dict(max_extend_tokens=1.5), TypeError, "max_extend_tokens must be an integer"),
        (dict(share_threshold=-1), ValueError, "share_threshold must be an integer >= 0"),
        (dict(cache="lru"), ValueError, "cache must be one of"),
        (dict(dtype="float7"), ValueError, "dtype must be one of"),
        (dict(dtype=16), TypeError, "dtype must be a string"),
        (dict(policy="shortest_first"), ValueError, "policy must be one of .*mixed"),
        (dict(overlap="no"), TypeError, "overlap must be True or False, got 'no'"),
        (dict(cuda_graph=1), TypeError, "cuda_graph must be True or False"),
        (dict(small_gemm="yes"), TypeError, "small_gemm must be True or False, got 'yes'"),
        (dict(decode_split_kv=0), TypeError, "decode_split_kv must be True or False"),
        (dict(decode_kernel="cuda"), ValueError, "decode_kernel must be one of"),
        (
            dict(cuda_graph_max_tokens=20000),
            ValueError,
            r"cuda_graph_max_tokens must be an integer in \[0, 16384\], got 20000",
        ),
        (dict(cuda_graph_max_tokens=-1), ValueError, "cuda_graph_max_tokens must be an integer"),
        (dict(max_seq_len=0), ValueError, "max_seq_len must be an integer >= 1, got 0"),
        (dict(max_seq_len=-5), ValueError, "max_seq_len must be an integer >= 1, got -5"),
        (dict(num_pages=2.5), TypeError, "num_pages must be an integer"),
        (dict(num_pages=0), ValueError, "num_pages must be an integer >= 1"),
        (dict(max_running_reqs=True), TypeError, "max_running_reqs must be an integer"),
        (dict(memory_ratio=0), ValueError, r"memory_ratio must be a finite number in \(0.0"),
        (dict(device="tpu"), ValueError, "device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
        (dict(device=0), TypeError, "device must be a string"),
        (dict(attention="xformers"), ValueError, "attention must be one of"),
        (dict(record="all"), ValueError, "record must be one of"),
        (dict(record=True), TypeError, r"record must be one of .*got True \(a bool\)"),
        (dict(policy=3), TypeError, "policy must be one of"),
        (dict(seed=None), TypeError, "seed must be an integer"),
        # sizes no memory holds, or the model never trained for: named, not a MemoryError
        (dict(num_pages=10**12), ValueError, r"num_pages=1,000,000,000,000 asks for .* at most"),
        (dict(kv_memory_gb=1e9), ValueError, r"kv_memory_gb=1000000000.0 asks for .* GiB"),
        (dict(kv_memory_gb=1e-9), ValueError, r"kv_memory_gb=1e-09 holds no page .* give at"),
        (dict(max_seq_len=10**9), ValueError, "max_seq_len=1,000,000,000 is longer than the mod"),
        (dict(profile_steps=range(-5, 3)), ValueError, r"profile_steps=range\(-5, 3\) chooses no"),
        (dict(profile_steps=range(5, 0)), ValueError, "chooses no step"),
        (dict(profile_steps=range(9, 0, -1)), ValueError, "chooses no step"),
        (dict(max_profiled_steps=0), ValueError, "max_profiled_steps must be an integer >= 1"),
    ],
)
def test_bad_engine_options(kwargs, error, message):
    with pytest.raises(error, match=message):
        LLM("tiny-llama", **kwargs)


@pytest.mark.parametrize(
    "name, ours",
    [
        ("max_num_seqs", "max_running_reqs"),  # vLLM
        ("max_running_requests", "max_running_reqs"),  # SGLang
        ("max_num_batched_tokens", "max_extend_tokens"),
        ("chunked_prefill_size", "max_extend_tokens"),
        ("chunk", "max_extend_tokens"),
        ("block_size", "page_size"),
        ("tensor_parallel_size", "tp_size"),
        ("gpu_memory_utilization", "memory_ratio"),
        ("enforce_eager", "cuda_graph=False"),
    ],
)
def test_another_engines_keyword_is_refused_naming_ours(name, ours):
    with pytest.raises(TypeError, match=f"LLM has no keyword '{name}': here it is {ours}"):
        LLM("tiny-llama", **{name: 1})


def test_sampling_keywords_of_other_libraries_are_refused_naming_ours():
    with pytest.raises(TypeError, match="no keyword 'max_new_tokens': it is max_tokens here"):
        SamplingParams(max_new_tokens=8)
    with pytest.raises(TypeError, match="no keyword 'stop': stop strings are the server's"):
        SamplingParams(stop=["\n"])
    with pytest.raises(TypeError, match="no keyword 'colour'; it takes max_tokens, temperature"):
        SamplingParams(colour=1)
    # made as before: positionally, replaced, copied
    params = SamplingParams(8, 0.5, logit_bias={3: 1.0})
    assert dataclasses.replace(params, max_tokens=4).max_tokens == 4
    assert pickle.loads(pickle.dumps(params)) == params


def test_an_unknown_keyword_is_refused_naming_what_is_taken(llm):
    with pytest.raises(TypeError, match="LLM has no keyword 'colour'; it takes attention, "):
        LLM("tiny-llama", colour=1)
    with pytest.raises(
        TypeError, match="reconfigure has no keyword 'max_num_seqs': here it is max_running_reqs"
    ):
        llm.reconfigure(max_num_seqs=2)
    with pytest.raises(
        TypeError, match="reconfigure has no keyword 'colour'; it takes cache, max_extend"
    ):
        llm.check_settings(colour=1)
    with pytest.raises(ValueError, match="page_size.* belong to the engine"):
        llm.reconfigure(page_size=4)
    with pytest.raises(
        ValueError, match="prompt 0 has 1 token; with max_tokens=10000 that is 10001"
    ):
        llm.generate([[5]], SamplingParams(max_tokens=10_000))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_without_a_gpu_is_named():
    with pytest.raises(ValueError, match="device 'cuda' is not available: torch sees 0"):
        LLM("tiny-llama", device="cuda")


def test_unknown_model_names_the_choices():
    with pytest.raises(ValueError, match="unknown model 'no-such-model'.*smollm2"):
        LLM("no-such-model")
    with pytest.raises(ValueError, match="unknown model 'dummy:gpt-17'"):
        LLM("dummy:gpt-17")
    with pytest.raises(TypeError, match="model must be a name or a path"):
        LLM(17)


def test_bad_engine_options_fail_before_loading_a_model(monkeypatch):
    """EngineConfig checks its knobs on construction, so nothing heavy has started."""
    with pytest.raises(ValueError, match="power of two"):
        EngineConfig(model="smollm2", page_size=6)


def test_a_context_that_is_not_whole_pages():
    """max_seq_len 100 with pages of 16: a request may use all 100 positions (the page table
    is 112 wide, so the last page fits), in prefill and in decode, and the engine goes on."""
    llm = LLM("tiny-llama", page_size=16, max_seq_len=100, num_pages=64)
    for prompt_len, max_tokens in ((99, 1), (90, 10), (4, 3)):
        prompt = [5] * prompt_len
        outputs, _ = run(llm, [prompt], greedy(max_tokens))
        assert outputs[0]["token_ids"] == hf_greedy("tiny-llama", [prompt], max_tokens)[0]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda wb: wb.add_request("hi", greedy(2), arrival_step=-1), ValueError, "arrival_step"),
        (lambda wb: wb.add_request("hi", greedy(2), arrival_step=1.5), TypeError, "arrival_step"),
        (lambda wb: wb.add_request("hi", greedy(2), arrival_time=-1), ValueError, "arrival_time"),
        (lambda wb: wb.add_request("hi", greedy(2), arrival_time="1s"), TypeError, "arrival_time"),
        (lambda wb: wb.add_request("hi", {"max_tokens": 2}), TypeError, "SamplingParams"),
        (lambda wb: wb.step(0), ValueError, "n must be an integer >= 1, got 0"),
        (lambda wb: wb.step(True), TypeError, "n must be an integer"),
        (lambda wb: wb.run(max_steps="10"), TypeError, "max_steps must be an integer"),
        (lambda wb: wb.run(progress="yes"), TypeError, "progress must be True or False"),
        (lambda wb: wb.run_until(5), TypeError, "predicate must be a function"),
        (lambda wb: wb.abort("3"), TypeError, "uid must be an integer"),
        (lambda wb: wb.abort(99), ValueError, "no request 99"),
        (lambda wb: wb.reconfigure(max_extend_tokens=0), ValueError, "max_extend_tokens"),
        (lambda wb: wb.compare({"a": {}}, progress="x"), TypeError, "progress must be True"),
        (lambda wb: wb.compare({"a": {}}, arrival="bogus"), ValueError, "arrival must be one"),
        (lambda wb: wb.compare({"a": {}}, requests=[]), ValueError, "requests is empty"),
        (lambda wb: wb.compare({"a": {}}, requests="hello"), TypeError, "a list of .* or a Trace"),
        (lambda wb: wb.compare({1: {}, "1": {}}), ValueError, "names '1' twice"),
    ],
)
def test_bad_workbench_calls(call, error, message):
    """Refused before anything changes: a run made before the bad call is still there."""
    wb = Workbench("tiny-llama", max_running_reqs=2)
    wb.add_request("Hello", greedy(2))
    wb.run(progress=False)
    before = len(wb.history.steps)
    with pytest.raises(error, match=message):
        call(wb)
    assert len(wb.history.steps) == before and len(wb.history.requests) == 1
    assert wb.scheduler.is_idle and wb.is_done
    wb.add_request("The capital of France is", greedy(3))
    wb.run(progress=False)
    wb.check_integrity()


def test_a_closed_workbench_says_so_whatever_is_asked():
    wb = Workbench("tiny-llama")
    wb.add_request("Hello", greedy(2))
    wb.run(progress=False)
    wb.close()
    for call in (
        lambda: wb.hooks.add("admit", print),
        lambda: wb.history,
        lambda: wb.reset(),
        lambda: wb.abort(0),
        lambda: wb.compare({"a": {}}, [("x", greedy(2))]),
        lambda: wb.snapshot(),
    ):
        with pytest.raises(RuntimeError, match="this LLM was closed"):
            call()

"""Tensor parallelism end to end on the CPU: rank 0 here schedules, a second process (gloo) runs
the other half of every layer. Greedy output equals Hugging Face token for token under chunking,
radix sharing, each policy and an abort; every rank's request table equals rank 0's after every
run; a rank that dies gives rank 0 a clear error within seconds instead of a hang."""

from __future__ import annotations

import json

import pytest

from workbench import LLM, SamplingParams, Workbench, load_run, viz
from workbench.policies import POLICIES

from .conftest import greedy, hf_greedy, run

MODEL = "tiny-qwen3"  # 4 query heads, 2 KV heads: two ranks of 2 and 1
PROMPTS = [
    [5, 17, 33, 2, 91, 4, 4, 8, 120, 7, 3, 61],
    [9, 9, 9, 14],
    [5, 17, 33, 2, 91, 4, 4, 8, 120, 7, 44, 45, 46, 47, 48],  # shares a prefix with the first
    [250, 1, 3],
    list(range(100, 131)),
]


@pytest.fixture(scope="module")
def wb2():
    """One two-rank engine for the module (a process runs one tensor-parallel engine at a time)."""
    wb = Workbench(MODEL, device="cpu", tp_size=2, max_running_reqs=8, record="light")
    yield wb
    wb.close()


@pytest.fixture(scope="module")
def expected() -> list[list[int]]:
    return hf_greedy(MODEL, PROMPTS, 10)


@pytest.mark.parametrize("overlap", [False, True], ids=["no-overlap", "overlap"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("max_extend_tokens", [3, 8192])
def test_two_ranks_match_hf(wb2, expected, policy, max_extend_tokens, overlap):
    """Both chunk sizes, each policy, overlap off and on, on one two-rank engine; the second
    run is served from the radix cache. `run` checks the KV pool, and with it that both ranks'
    tables agree (with overlap, rank 0's table writes reach the others a step later)."""
    wb2.reconfigure(policy=policy, max_extend_tokens=max_extend_tokens, overlap=overlap)
    for _ in range(2):
        outputs, steps = run(wb2.llm, PROMPTS, greedy(10))
        assert [o["token_ids"] for o in outputs] == expected
        assert all(s.tp_size == 2 for s in steps)
    assert sum(o["cached_tokens"] for o in outputs) > 0  # the second run shared prefixes


def test_two_ranks_report_hugging_faces_logprobs(wb2, expected):
    """Rank 0 reports each output token's log probability (its gathered logits') as Hugging
    Face's forward gives it, and the 3 most likely tokens there."""
    import torch

    from .conftest import hf_model

    wb2.reconfigure(policy="prefill_first", max_extend_tokens=8192, overlap=True)
    outputs, _ = run(wb2.llm, PROMPTS, SamplingParams(max_tokens=10, ignore_eos=True, logprobs=3))
    assert [o["token_ids"] for o in outputs] == expected
    for prompt, out in zip(PROMPTS, outputs):
        with torch.inference_mode():
            logits = hf_model(MODEL)(torch.tensor([prompt + out["token_ids"]])).logits[0]
        ref = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1)
        tokens = torch.tensor(out["token_ids"])
        expected_logprobs = ref[torch.arange(len(tokens)), tokens].tolist()
        assert [lp for lp, _ in out["logprobs"]] == pytest.approx(expected_logprobs, abs=1e-4)
        assert [[i for i, _ in top] for _, top in out["logprobs"]] == ref.topk(3).indices.tolist()


def test_two_ranks_report_hugging_faces_prompt_logprobs(wb2, expected):
    """Rank 0 reports each prompt token's log probability from the gathered logits of every
    prompt position, in chunks of 5 (the ranks run the same extra rows), as Hugging Face's
    forward gives it; the output tokens are unchanged."""
    import torch

    from .conftest import hf_model

    wb2.reconfigure(policy="prefill_first", max_extend_tokens=5, overlap=True)
    asked = SamplingParams(max_tokens=10, ignore_eos=True, prompt_logprobs=2)
    outputs, _ = run(wb2.llm, PROMPTS, asked)
    assert [o["token_ids"] for o in outputs] == expected
    for prompt, out in zip(PROMPTS, outputs):
        with torch.inference_mode():
            logits = hf_model(MODEL)(torch.tensor([prompt])).logits[0]
        ref = torch.log_softmax(logits[:-1].float(), -1)
        want = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].tolist()
        entries = out["prompt_logprobs"]
        assert entries[0] is None
        assert [lp for lp, _ in entries[1:]] == pytest.approx(want, abs=1e-4)
        assert [[i for i, _ in top] for _, top in entries[1:]] == ref.topk(2).indices.tolist()


def test_one_rank_matches_hf(expected):
    llm = LLM(MODEL, device="cpu", tp_size=1, max_running_reqs=8, max_extend_tokens=3)
    outputs, _ = run(llm, PROMPTS, greedy(10))
    assert [o["token_ids"] for o in outputs] == expected


def test_abort_and_records_with_two_ranks(wb2, expected):
    """Stepping by hand: a request aborted part-way frees its slot and pages on rank 0; the
    others finish as Hugging Face does; each record says the step ran on two ranks."""
    wb = wb2
    wb.reset()
    wb.reconfigure(policy="prefill_first", max_extend_tokens=4)
    uids = [wb.add_request(p, greedy(10)) for p in PROMPTS]
    wb.step(3)
    wb.abort(uids[1])
    wb.run(progress=False)
    wb.check_integrity()
    outputs = {o["uid"]: o for o in wb.outputs()}
    for uid, want in zip(uids, expected):
        got = outputs[uid]
        if uid == uids[1]:
            assert got["finish_reason"] == "abort"
        else:
            assert got["token_ids"] == want
    steps = wb.history.steps
    assert set(steps.tp_size) == {2}
    # each rank's own device time of every step (rank 0's is device_ms)
    assert (steps.device_ms_rank1 > 0).all() and (steps.device_ms > 0).all()
    assert wb.history[0].rank_device_ms == [pytest.approx(steps.device_ms_rank1.iloc[0])]


def test_every_rank_samples_each_request_as_its_params_say(wb2):
    """A request's sampling reaches the ranks once, on its first step: with temperatures and
    seeds differing per request, every rank's token pool still equals rank 0's (`run` checks
    them) in two runs, and rank 0 forgets the requests that ended."""
    wb2.reconfigure(policy="prefill_first", max_extend_tokens=5, overlap=True)
    for run_seed in (1, 2):
        params = [
            SamplingParams(max_tokens=8, temperature=0.7 + 0.2 * i, seed=10 * run_seed + i)
            if i % 2
            else greedy(8)
            for i in range(len(PROMPTS))
        ]
        outputs, _ = run(wb2.llm, PROMPTS, params)
        assert all(o["finish_reason"] in ("length", "stop") for o in outputs)
    assert wb2.llm.engine.ranks.requests_known <= len(PROMPTS)  # only the last run's, at most


def test_a_bias_reaches_every_rank_and_a_penalty_is_refused_by_name(wb2, expected):
    """`logit_bias` is sampled alike on both ranks (their token pools agree: `run` checks) and
    forces its token; a penalty is refused before anything is queued (the other ranks lack a
    cached prefix's tokens), and the engine serves on."""
    wb2.reconfigure(policy="prefill_first", max_extend_tokens=8192, overlap=True)
    forced = SamplingParams(max_tokens=6, ignore_eos=True, logit_bias={77: 100.0})
    outputs, _ = run(wb2.llm, PROMPTS[:2], [forced, greedy(10)])
    assert outputs[0]["token_ids"] == [77] * 6 and outputs[1]["token_ids"] == expected[1]
    with pytest.raises(ValueError, match="presence_penalty.*tensor parallelism"):
        wb2.llm.generate(PROMPTS[:1], SamplingParams(presence_penalty=1.0))
    outputs, _ = run(wb2.llm, PROMPTS, greedy(10))
    assert [o["token_ids"] for o in outputs] == expected


def test_a_server_of_two_ranks_answers_and_refuses_a_penalty_by_name(wb2, expected):
    """Served over HTTP from the two-rank engine: a completion's tokens are Hugging Face's, and a
    penalty is a 400 naming the field asked (the other ranks lack a cached prefix's tokens)."""
    import httpx

    wb2.reconfigure(policy="prefill_first", max_extend_tokens=8192, overlap=True)
    server = wb2.serve(port=0)
    try:
        body = {"prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0, "ignore_eos": True}
        url = server.url + "/completions"
        answer = httpx.post(url, json=body | {"return_token_ids": True}, timeout=60)
        assert answer.json()["choices"][0]["token_ids"] == expected[0]
        refused = httpx.post(url, json=body | {"repetition_penalty": 1.2}, timeout=60)
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["param"] == "repetition_penalty", error
        assert "tensor parallelism" in error["message"]
    finally:
        wb2.stop_serving()


def test_the_rank_times_chart_draws_every_ranks_device_time(wb2, tmp_path):
    wb2.reset()
    for p in PROMPTS[:3]:
        wb2.add_request(p, greedy(4))
    wb2.run(progress=False)
    steps = wb2.history.steps
    spec = viz.rank_times(wb2.history, highlight_step=1).to_dict()
    (rows,) = [v for v in spec["datasets"].values() if v and "rank" in v[0]]
    by_rank = {r: [row["ms"] for row in rows if row["rank"] == r] for r in ("rank 0", "rank 1")}
    assert by_rank == {
        "rank 0": pytest.approx(steps.device_ms.tolist()),
        "rank 1": pytest.approx(steps.device_ms_rank1.tolist()),
    }
    # ranks whose lines coincide stay apart: a dash and a point shape per rank, the gap titled
    (layer,) = [v for v in spec["layer"] if "strokeDash" in v.get("encoding", {})]
    assert layer["encoding"]["strokeDash"]["field"] == layer["encoding"]["shape"]["field"] == "rank"
    gap = (steps.device_ms - steps.device_ms_rank1).abs().max()
    assert f"at most {gap:.3f} ms apart" in json.dumps(spec)
    loaded = load_run(wb2.save(tmp_path / "run.parquet"))
    assert viz.rank_times(loaded, highlight_step=1).to_dict() == spec
    one = Workbench(MODEL, device="cpu", max_running_reqs=2)
    one.add_request(PROMPTS[0], greedy(2))
    one.step()
    assert "one rank" in json.dumps(viz.rank_times(one.history).to_dict())


def test_rank_device_times_survive_a_save(wb2, tmp_path):
    wb2.reset()
    for p in PROMPTS[:2]:
        wb2.add_request(p, greedy(4))
    wb2.run(progress=False)
    loaded = load_run(wb2.save(tmp_path / "run.parquet"))
    assert loaded.steps.device_ms_rank1.tolist() == wb2.history.steps.device_ms_rank1.tolist()
    assert loaded.steps.device_ms_rank1.notna().all()


def test_a_rank_starts_without_runpys_warning():
    """Ranks run `python -m workbench.engine.worker`; `import workbench` must not import that
    module first, or every rank warns (RuntimeWarning: found in sys.modules) at start."""
    import subprocess
    import sys

    code = "import sys, workbench; print('workbench.engine.worker' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stdout

"""The planted induction model's workload, shared by the GPU correctness matrix and the
mixture-of-experts one: requests arriving while others decode, four sharing a document through
the radix cache, more requests than slots, one aborted mid-prompt and one mid-decode; every
answer must be the pattern's continuation (`models/induction.py`)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from workbench import LLM, SamplingParams, Workbench
from workbench.models.induction import pattern_continuation, pattern_prompts


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_tokens: int
    arrival_step: int


def workload(seed: int = 0) -> tuple[list[Request], int, int]:
    """12 requests and the indices of the two to abort (mid-prompt, mid-decode)."""
    rng = random.Random(seed)
    document = pattern_prompts(rng, [60, 90, 130, 170], period=17)  # shared through the cache
    shorts = [pattern_prompts(rng, [rng.randint(12, 50)], period=rng.randint(3, 9))[0]]
    shorts += [pattern_prompts(rng, [rng.randint(12, 50)], period=rng.randint(3, 9))[0]]
    shorts += [pattern_prompts(rng, [rng.randint(12, 50)], period=rng.randint(3, 9))[0]]
    shorts += [pattern_prompts(rng, [rng.randint(12, 50)], period=rng.randint(3, 9))[0]]
    (long,) = pattern_prompts(rng, [240], period=31)
    (chat,) = pattern_prompts(rng, [30], period=5)
    requests = [
        Request(document[0], 12, 0),
        Request(chat, 64, 0),  # aborted mid-decode
        Request(shorts[0], 8, 0),
        Request(document[1], 16, 1),
        Request(long, 6, 2),  # aborted mid-prompt
        Request(shorts[1], 20, 3),
        Request(shorts[2], 5, 5),
        Request(document[2], 10, 8),
        Request(shorts[3], 24, 12),
        Request(document[3], 8, 20),
        Request(pattern_prompts(rng, [44], period=11)[0], 14, 30),
        Request(pattern_prompts(rng, [80], period=19)[0], 6, 45),
    ]
    return requests, 4, 1


def run_workload(wb: Workbench, chunk: int, policy: str, overlap: bool, graphs: bool) -> dict:
    """The workload on `wb` under one setting, every answer and the pool's integrity checked;
    what the matrix's summary counts."""
    wb.reconfigure(max_extend_tokens=chunk, policy=policy, overlap=overlap, record="light")
    requests, prompt_victim, decode_victim = workload()
    uids = [
        wb.add_request(
            r.prompt, SamplingParams(max_tokens=r.max_tokens, ignore_eos=True), r.arrival_step
        )
        for r in requests
    ]
    aborted: dict[int, bool] = {}  # victim index -> aborted before its first token
    while not wb.is_done:
        wb.step()
        live = {r.uid: r for r in wb.scheduler.live_reqs}
        victim = live.get(uids[prompt_victim])
        if prompt_victim not in aborted and victim is not None:
            aborted[prompt_victim] = victim.output_len <= 0  # a chunk's is below 0
            wb.abort(victim.uid)
        victim = live.get(uids[decode_victim])
        if decode_victim not in aborted and victim is not None and victim.output_len >= 3:
            aborted[decode_victim] = False
            wb.abort(victim.uid)
    wb.check_integrity()
    assert set(aborted) == {prompt_victim, decode_victim}

    outputs = {o["uid"]: o for o in wb.outputs()}
    exact = 0
    for i, (uid, r) in enumerate(zip(uids, requests)):
        got = outputs[uid]["token_ids"]
        want = pattern_continuation(r.prompt, r.max_tokens)
        if i in aborted:
            assert outputs[uid]["finish_reason"] == "abort"
            assert got == want[: len(got)] and len(got) < r.max_tokens
        else:
            assert outputs[uid]["finish_reason"] == "length"
            assert got == want, f"request {i} differs from the pattern's continuation"
            exact += 1
    assert 3 <= len(outputs[uids[decode_victim]]["token_ids"]) < 64
    # mid-prompt at least whenever its prompt cannot run in one step (a smaller budget, which
    # other prompts may share) or the step boundary falls while it is in flight (overlap)
    if chunk < len(requests[prompt_victim].prompt) or overlap:
        assert aborted[prompt_victim]
    phases = set(wb.history.steps.phase)
    assert ("mixed" in phases) == (policy == "mixed" and chunk > 8)
    if graphs:
        decode = wb.history.steps.query("phase == 'decode'")
        assert decode.cuda_graph.all()
    return dict(
        outputs=len(requests) - 2,
        exact=exact,
        mid_prompt=aborted[prompt_victim],
        mid_decode=not aborted[decode_victim],
    )


def check_decisive(llm: LLM, prompts: list[list[int]], tokens: int = 8) -> None:
    """Greedy answers are the patterns' continuations, and at every step the top logit leads
    the next by over a quarter of the largest: far more than bf16 could move it."""
    logits = []
    hook = llm.engine.model.register_forward_hook(lambda m, i, out: logits.append(out))
    try:
        out = llm.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))
    finally:
        hook.remove()
    llm.check_integrity()
    assert [o["token_ids"] for o in out] == [pattern_continuation(p, tokens) for p in prompts]
    top = torch.cat(logits).topk(2, dim=-1).values
    assert (top[:, 0] - top[:, 1]).min() > 0.25 * top[:, 0].max()


def eos_prompts(eos: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts whose pattern holds the end-of-sequence token `eos`, so that the planted model's
    greedy answer reaches it after a known number of tokens (2 to 6 here, one request with no
    EOS within 16), and the answers up to and including it."""
    rng = random.Random(seed)
    prompts, answers = [], []
    for n, period, at in ((30, 5, 1), (41, 7, 2), (25, 4, 3), (60, 9, 5), (33, 6, None)):
        (prompt,) = pattern_prompts(rng, [n], period)
        if at is not None:  # the pattern token that comes `at` tokens into the answer
            target = pattern_continuation(prompt, at + 1)[at]
            prompt = [eos if t == target else t for t in prompt]
        answer = pattern_continuation(prompt, 16)
        prompts.append(prompt)
        answers.append(answer[: answer.index(eos) + 1] if eos in answer else answer)
    return prompts, answers


def planted_in_transformers(llm: LLM):
    """transformers' model of `llm`'s planted weights (float32, CPU), from its own config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from workbench.models.weights import to_hf_state_dict

    try:  # every weight is loaded below: drawing them first took 3.5 s (tiny-induction)
        from transformers.initialization import no_init_weights
    except ImportError:  # (a transformers without it: the weights drawn, then replaced)
        from contextlib import nullcontext as no_init_weights

    config = AutoConfig.from_pretrained(llm.engine.model_dir)
    with no_init_weights():
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(llm.engine.model), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    return hf

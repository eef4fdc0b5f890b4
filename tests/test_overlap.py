"""Overlap scheduling (the CPU runs the same code path; only the device is synchronous):
identical outputs, exact max_tokens, EOS handled one step late but never leaked, no slot or page
freed while a launched batch still uses it."""

from __future__ import annotations

import pytest

from workbench import LLM, SamplingParams

from .conftest import PROMPTS, greedy, hf_greedy, run
from .planted import eos_prompts


def chat_prompts(llm: LLM) -> list[list[int]]:
    questions = ["Write a haiku about the sea.", "Say hello.", "What is 2+2?", "Name a color."]
    return [
        llm.encode(
            llm.tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            )
        )
        for q in questions
    ]


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(max_extend_tokens=5, page_size=4),
        dict(cache="naive", max_running_reqs=2),
        dict(num_pages=64, max_running_reqs=8),
    ],
)
def test_overlap_gives_the_same_tokens(options):
    llms = {ov: LLM("tiny-qwen3", overlap=ov, **options) for ov in (False, True)}
    ids = [llms[False].encode(p) for p in PROMPTS]
    params = [
        SamplingParams(max_tokens=n, temperature=0.8, seed=i, ignore_eos=True)
        if i % 2
        else greedy(n)
        for i, n in enumerate([3, 9, 1, 6, 12])
    ]
    results = {}
    for ov, llm in llms.items():
        outputs, _ = run(llm, ids, params)
        results[ov] = [o["token_ids"] for o in outputs]
        assert [o["completion_tokens"] for o in outputs] == [p.max_tokens for p in params]
    assert results[True] == results[False]
    greedy_rows = [i for i, p in enumerate(params) if p.temperature == 0]
    refs = hf_greedy("tiny-qwen3", [ids[i] for i in greedy_rows], 12)
    for i, ref in zip(greedy_rows, refs):
        assert results[True][i] == ref[: params[i].max_tokens]


def test_eos_under_overlap_is_dropped_a_step_late_and_freed_after():
    """The planted model reaches EOS 2 to 6 tokens into four answers (a fifth runs to its
    length), with five requests in four slots: each answer is the pattern's up to EOS, the
    same as without overlap."""
    llm = LLM("dummy:tiny-induction", overlap=True, max_running_reqs=4)
    prompts, answers = eos_prompts(llm.engine.model_config.eos_token_ids[0])
    outputs = _check_eos_under_overlap(llm, prompts, SamplingParams(max_tokens=16))
    assert [o["token_ids"] for o in outputs] == answers
    assert [o["finish_reason"] for o in outputs] == ["stop"] * 4 + ["length"]


@pytest.mark.slow  # SmolLM2's chat answers (~12 s); the planted model's EOS stays in make test
def test_eos_under_overlap_on_smollm2_chats():
    llm = LLM("smollm2", overlap=True, max_running_reqs=4)
    outputs = _check_eos_under_overlap(llm, chat_prompts(llm), SamplingParams(max_tokens=48))
    assert sum(o["finish_reason"] == "stop" for o in outputs) >= 2


def _check_eos_under_overlap(llm: LLM, prompts, sp: SamplingParams) -> list[dict]:
    """The tokens of `prompts` with overlap equal those without; a request that stopped on EOS
    ends on it, holds no other, and is in no batch after the one launched before its EOS was
    seen, and at least one request was in that batch. The outputs with overlap."""
    outputs, steps = run(llm, prompts, sp)
    llm.reconfigure(overlap=False)  # the same engine without overlap gives the reference
    expected, _ = run(llm, prompts, sp)
    llm.reconfigure(overlap=True)
    assert [o["token_ids"] for o in outputs] == [o["token_ids"] for o in expected]
    eos = set(llm.engine.model_config.eos_token_ids)
    stopped = [o for o in outputs if o["finish_reason"] == "stop"]
    for out in stopped:
        assert out["token_ids"][-1] in eos and not eos & set(out["token_ids"][:-1])
        # the step whose token was EOS, then at most one more launched batch holds it
        uid = out["uid"]
        last = next(s.step for s in steps if uid in s.finished)
        later = [s.step for s in steps if s.step > last and any(r.uid == uid for r in s.rows)]
        assert later in ([], [last + 1])
    assert any(
        any(r.uid == o["uid"] for s in steps for r in s.rows if s.step > _finish_step(steps, o))
        for o in stopped
    ), "expected at least one request to be in the batch launched before its EOS was seen"
    return outputs


def _finish_step(steps, out) -> int:
    return next(s.step for s in steps if out["uid"] in s.finished)


@pytest.mark.slow  # SmolLM2, a small pool (~20 s); overlap's tokens and EOS stay in make test
def test_slots_and_pages_are_not_reused_while_in_flight():
    """Many short requests finishing on EOS through a small pool and few slots: a slot freed
    too early would be handed to a new request while the batch in flight still writes to it."""
    llm = LLM("smollm2", overlap=True, max_running_reqs=3, num_pages=160)
    prompts = chat_prompts(llm) * 2
    params = [SamplingParams(max_tokens=n) for n in [30, 8, 20, 14] * 2]
    checks = []

    def check(record):
        # between steps a batch is in flight: every live request's row must point at pages
        # that are not free, and no two live requests may share a slot
        live = llm.scheduler.live_reqs
        assert len({r.table_idx for r in live}) == len(live)
        for r in live:
            n = r.cached_len
            assert not len(
                llm.scheduler.cache.free_pages_among(
                    llm.scheduler.table.page_table_host[r.table_idx, :n]
                )
            )
        checks.append(record.step)

    outputs = llm.generate(prompts, params, on_step=check)
    llm.check_integrity()
    llm.reconfigure(overlap=False)  # the same engine without overlap gives the reference
    expected, _ = run(llm, prompts, params)
    assert [o["token_ids"] for o in outputs] == [o["token_ids"] for o in expected]
    assert len(checks) > 20

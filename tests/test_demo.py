"""The demo's step lines: a count's noun agrees with it, and the columns stay aligned."""

from __future__ import annotations

import re

from workbench import SamplingParams, Workbench
from workbench.demo import describe


def test_the_demo_s_step_lines_say_one_request_and_one_token_in_aligned_columns():
    with Workbench("tiny-llama", record="light", max_extend_tokens=64) as wb:
        wb.add_request("The capital of France is a city that", SamplingParams(max_tokens=3))
        lines = [describe(wb.step())]
        wb.add_request("Hello, my name is", SamplingParams(max_tokens=6))
        while (record := wb.step()) is not None:
            lines.append(describe(record))
        wb.check_integrity()
    assert re.match(r"step +0  prefill +1 request +\d+ tokens \| #0 prefill", lines[0]), lines[0]
    one_decode = [line for line in lines if re.search(r"decode +1 request +1 token +\|", line)]
    assert one_decode, lines
    assert any(re.search(r" 2 requests +2 tokens \|", line) for line in lines), lines
    assert not [line for line in lines if re.search(r"\b1 (request|token)s\b|reqs", line)], lines
    assert len({line.index(" | ") for line in lines}) == 1, lines  # every count in its column

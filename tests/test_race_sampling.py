"""The one-pass sampling kernel (workbench/kernels/sampling.py) through Triton's interpreter on
the CPU: a greedy row takes the largest logit, the earliest of equal ones, without drawing noise;
a sampled row's token depends on its key and logits only, whatever shares the batch, and follows
the softmax of its logits over temperature. On the GPU the sampler's tests run it compiled."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the sampling kernel needs triton (pip install triton)")

from .interpreted import run_interpreted  # noqa: E402

VOCAB, BLOCK, SEGMENT = 3000, 256, 1024  # three segments, the last ragged
DRAWS = 200

CHILD = """
import sys
import torch
from workbench.kernels.sampling import race_sample

cases = torch.load(sys.argv[1])
out = {}
for name, (logits, temperatures, keys, segment) in cases.items():
    out[name] = race_sample(logits, temperatures, keys, block=256, segment=segment, num_warps=1)
torch.save(out, sys.argv[2])
"""


def _cases() -> dict:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, VOCAB, generator=gen) * 3
    logits[0, [1500, 2990]] = 50.0  # a tie across segments: the earlier column
    logits[1, [7, 8]] = 50.0  # a tie inside a lane's block
    logits[2, 2999] = 60.0  # the last column
    logits[5, [300, 364]] = 50.0  # a tie in one lane (64 columns apart): the earlier
    temperatures = torch.tensor([0.0, 0.0, 0.0, 0.8, 1.0, 0.0])
    keys = torch.tensor([11, 12, 13, 14, 15, 16])
    cases = {"batch": (logits, temperatures, keys, SEGMENT)}
    for row in (3, 4):  # each sampled row alone
        row_case = (logits[row : row + 1], temperatures[row : row + 1], keys[row:], SEGMENT)
        cases[f"row {row}"] = row_case
    # one row of three likely tokens, sampled under 200 keys: their shares follow the softmax
    # (one segment of one block a row: the interpreter takes about 36 ms a program here, whatever
    # the block, so the draws are most of this module's time)
    flat = torch.full((BLOCK,), -30.0)
    flat[[10, 120, 250]] = torch.tensor([1.0, 0.0, -1.0])
    cases["draws"] = (flat.repeat(DRAWS, 1), torch.ones(DRAWS), torch.arange(DRAWS) * 7 + 1, BLOCK)
    return cases


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    cases = _cases()
    return cases, run_interpreted(tmp_path_factory.mktemp("race"), CHILD, cases)


def test_greedy_rows_take_the_earliest_largest_logit(interpreted):
    cases, out = interpreted
    logits, temperatures, _, _ = cases["batch"]
    tokens = out["batch"]
    assert tokens[[0, 1, 2, 5]].tolist() == [1500, 7, 2999, 300]
    greedy = temperatures == 0
    assert torch.equal(tokens[greedy], logits[greedy].argmax(1))


def test_a_sampled_rows_token_is_its_own_whatever_shares_the_batch(interpreted):
    _, out = interpreted
    assert out["batch"][3:5].tolist() == [out["row 3"].item(), out["row 4"].item()]


def test_sampled_tokens_follow_the_softmax(interpreted):
    _, out = interpreted
    draws = out["draws"].tolist()
    assert set(draws) <= {10, 120, 250}
    shares = [draws.count(t) / len(draws) for t in (10, 120, 250)]
    expected = torch.softmax(torch.tensor([1.0, 0.0, -1.0]), 0).tolist()  # 0.665, 0.245, 0.090
    # 200 draws: a share's standard error is at most 0.034; 0.1 is three of them, and still
    # tells the softmax from one at twice or half the temperature (0.16 and 0.20 off on a share)
    assert shares == pytest.approx(expected, abs=0.1)

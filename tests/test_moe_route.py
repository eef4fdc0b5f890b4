"""The MoE routing kernels (workbench/kernels/moe_route.py) against the torch path they replace
(`SparseMoE.route`, `ForwardContext.route`'s counts, `fused_moe.align_to_blocks`): on the CPU
through Triton's interpreter, on the GPU compiled and in the planted MoE model's answers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the routing kernel needs triton (pip install triton)")

from workbench.kernels import moe_route  # noqa: E402
from workbench.kernels.fused_moe import align_to_blocks  # noqa: E402

from .interpreted import run_interpreted  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def reference(logits, top_k, renormalize, dtype, block_m, counted):
    """The torch path: weights and ids as `SparseMoE.route`, the counts `ForwardContext.route`
    adds (only counted tokens), the blocks as `align_to_blocks`. Equal weights (float16 and
    bfloat16 logits tie) in the kernel's order, the lower expert first: `torch.topk` leaves
    their order unspecified."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, ids = weights[:, :top_k], ids[:, :top_k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    routing = torch.zeros(logits.shape[1], dtype=torch.int32, device=logits.device)
    per_pair = counted[:, None].expand(ids.shape).reshape(-1).int()
    routing.index_add_(0, ids.reshape(-1), per_pair)
    sorted_pairs, block_experts = align_to_blocks(ids, logits.shape[1], block_m)
    return weights.to(dtype), ids, sorted_pairs, block_experts, routing


# (tokens, experts, top_k, block_m, renormalize): Qwen3-30B-A3B's router from one token to a
# batch of 256 (16 programs) and a tile's tail, Mixtral's, an expert count that is no power of
# two, a top-k that is none (DeepSeek's 6), small blocks, no renormalisation, experts that get no
# pair, and more tiles than MAX_PROGRAMS (programs of several tiles, the last one short)
SHAPES = {
    "1x128x8": (1, 128, 8, 16, True),
    "8x128x8": (8, 128, 8, 16, True),
    "37x128x8": (37, 128, 8, 16, True),
    "256x128x8": (256, 128, 8, 16, True),
    "5x8x2": (5, 8, 2, 16, True),
    "13x6x2-block4": (13, 6, 2, 4, True),
    "7x60x4-raw": (7, 60, 4, 16, False),
    "40x60x6": (40, 60, 6, 32, True),
    "1090x8x2-many-tiles": (1090, 8, 2, 64, True),
}


def make_case(tokens, experts, top_k, block_m, renormalize, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(tokens, experts, generator=gen) * 2).to(dtype)
    counted = (torch.rand(tokens, generator=gen) < 0.7).int()  # some tokens are padding
    return logits, top_k, renormalize, dtype, block_m, counted


CASES = {
    f"{name}-{str(dtype).removeprefix('torch.')}": make_case(*shape, dtype)
    for name, shape in SHAPES.items()
    for dtype in (torch.float32, torch.float16)
}

# run by `interpreted.run_interpreted` in a child process
CHILD = """
import sys, torch
from workbench.kernels.moe_route import route_and_align
cases, outputs = torch.load(sys.argv[1]), {}
for name, (logits, top_k, renorm, dtype, block_m, counted) in cases.items():
    routing = torch.zeros(logits.shape[1], dtype=torch.int32)
    out = route_and_align(logits, top_k, renorm, dtype, block_m, routing, counted)
    outputs[name] = (*out, routing)
torch.save(outputs, sys.argv[2])
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, tuple]:
    """Each case's output from the kernel run by Triton's interpreter (numpy, on the CPU)."""
    return run_interpreted(tmp_path_factory.mktemp("moe_route"), CHILD, CASES)


def _check(got: tuple, want: tuple) -> None:
    weights, ids, sorted_pairs, block_experts, routing = got
    want_weights, want_ids, want_sorted, want_blocks, want_routing = want
    assert ids.dtype == torch.int64 and torch.equal(ids.cpu(), want_ids.cpu())
    assert weights.dtype == want_weights.dtype
    torch.testing.assert_close(weights.float().cpu(), want_weights.float().cpu())
    assert torch.equal(sorted_pairs.cpu(), want_sorted.cpu())
    assert torch.equal(block_experts.cpu(), want_blocks.cpu())
    assert torch.equal(routing.cpu(), want_routing.cpu())


@pytest.mark.parametrize("case", CASES)
def test_interpreted_kernel_routes_and_sorts_as_the_torch_path(interpreted, case):
    _check(interpreted[case], reference(*CASES[case]))


@pytest.mark.parametrize(("tokens", "top_k"), [(0, 2), (4, 9), (4, 0)])
def test_no_tokens_or_a_top_k_past_the_experts_is_refused_naming_both(tokens, top_k):
    with pytest.raises(ValueError, match=f"got {tokens} tokens and top_k {top_k}"):
        moe_route.route_and_align(torch.zeros(tokens, 8), top_k, True, torch.float32, 16)


@pytest.mark.parametrize(
    "case",
    ["1x128x8", "8x128x8", "37x128x8", "256x128x8", "5x8x2", "40x60x6", "1090x8x2-many-tiles"],
)
@pytest.mark.gpu
@needs_cuda
def test_gpu_kernel_routes_and_sorts_as_the_torch_path(case):
    logits, top_k, renorm, _, block_m, counted = make_case(*SHAPES[case], torch.bfloat16, seed=4)
    logits, counted = logits.cuda(), counted.cuda()
    routing = torch.zeros(logits.shape[1], dtype=torch.int32, device="cuda")
    got = moe_route.route_and_align(logits, top_k, renorm, logits.dtype, block_m, routing, counted)
    _check((*got, routing), reference(logits, top_k, renorm, logits.dtype, block_m, counted))


def test_the_kernel_is_counted_in_the_router_family():
    """A profile's kernel breakdown names the routing kernels by their Triton names: "router", not
    "sampling" (whose softmax and top-k the torch path's routing shares) or "other"."""
    from workbench.history.families import family
    from workbench.palette import FAMILY_COLORS

    for kernel in (moe_route.moe_route_topk, moe_route.moe_route_align):
        assert family(kernel.__name__, "kernel") == "router"
    assert "router" in FAMILY_COLORS

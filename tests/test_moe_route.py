"""The one-launch MoE routing kernel (workbench/kernels/moe_route.py) against the torch path it
replaces at small batches (`SparseMoE.route`, `ForwardContext.route`'s counts, `fused_moe.
align_to_blocks`): on the CPU through Triton's interpreter, on the GPU compiled and in the
planted MoE model's answers."""

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


# (tokens, experts, top_k, block_m, renormalize): Qwen3-30B-A3B's router from one token to
# MAX_PAIRS pairs, Mixtral's, an expert count that is no power of two, small blocks, no
# renormalisation, and experts that get no pair
SHAPES = {
    "1x128x8": (1, 128, 8, 16, True),
    "8x128x8": (8, 128, 8, 16, True),
    "32x128x8": (32, 128, 8, 16, True),
    "5x8x2": (5, 8, 2, 16, True),
    "13x6x2-block4": (13, 6, 2, 4, True),
    "7x60x4-raw": (7, 60, 4, 16, False),
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


def test_more_pairs_than_it_takes_are_refused_naming_the_limit():
    logits = torch.zeros(moe_route.MAX_PAIRS // 2 + 1, 8)
    with pytest.raises(ValueError, match=f"1 to {moe_route.MAX_PAIRS} pairs"):
        moe_route.route_and_align(logits, 2, True, torch.float32, 16)


@pytest.mark.parametrize("case", ["1x128x8", "8x128x8", "32x128x8", "5x8x2"])
@pytest.mark.gpu
@needs_cuda
def test_gpu_kernel_routes_and_sorts_as_the_torch_path(case):
    logits, top_k, renorm, _, block_m, counted = make_case(*SHAPES[case], torch.bfloat16, seed=4)
    logits, counted = logits.cuda(), counted.cuda()
    routing = torch.zeros(logits.shape[1], dtype=torch.int32, device="cuda")
    got = moe_route.route_and_align(logits, top_k, renorm, logits.dtype, block_m, routing, counted)
    _check((*got, routing), reference(logits, top_k, renorm, logits.dtype, block_m, counted))


def test_the_layers_limit_is_the_kernels():
    from workbench.layers.moe import ROUTE_MAX_PAIRS

    assert ROUTE_MAX_PAIRS == moe_route.MAX_PAIRS


def test_the_kernel_is_counted_in_the_router_family():
    """A profile's kernel breakdown names the routing kernel by its Triton name: "router", not
    "sampling" (whose softmax and top-k the torch path's routing shares) or "other"."""
    from workbench.history.families import family
    from workbench.palette import FAMILY_COLORS

    assert family(moe_route.moe_route_align.__name__, "kernel") == "router"
    assert "router" in FAMILY_COLORS

"""The fused MoE Triton kernel (workbench/kernels/fused_moe.py) against a plain torch loop over
each token's experts: on the CPU through Triton's interpreter (float32 and float16), on the GPU
compiled (bfloat16 at decode and prefill sizes, float32, a CUDA graph with no host sync)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the fused MoE kernel needs triton (pip install triton)")

from workbench.kernels import fused_moe as compiled  # noqa: E402

from .interpreted import run_interpreted  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def reference(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """The definition, token by token and expert by expert, in float32."""
    x, w13, w2, topk_weights = x.float(), w13.float(), w2.float(), topk_weights.float()
    inter = w2.shape[2]
    y = torch.zeros_like(x)
    for t, experts in enumerate(topk_ids.tolist()):
        for k, e in enumerate(experts):
            gate_up = w13[e] @ x[t]
            act = F.silu(gate_up[:inter]) * gate_up[inter:]
            y[t] += topk_weights[t, k] * (w2[e] @ act)
    return y


def make_inputs(tokens, experts, top_k, hidden, inter, dtype, device, seed=0, route=None):
    """Weights scaled so that outputs are of order one; routing as a softmax router's top-k,
    renormalised (or `route` [tokens, top_k] given)."""
    gen = torch.Generator(device).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    x = randn(tokens, hidden)
    w13 = randn(experts, 2 * inter, hidden, scale=hidden**-0.5)
    w2 = randn(experts, hidden, inter, scale=inter**-0.5)
    probs = torch.randn(tokens, experts, generator=gen, device=device).softmax(-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if route is not None:
        ids = route.to(device)
        weights = probs.gather(1, ids)
    weights = (weights / weights.sum(-1, keepdim=True)).to(dtype)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize(
    "experts, route",
    [
        (8, torch.randint(0, 8, (13, 2), generator=torch.Generator().manual_seed(1))),
        (4, torch.tensor([[0, 3]] * 9 + [[3, 0]] * 8)),  # two experts full, two empty
        (64, torch.tensor([[5, 40], [40, 63]])),  # more experts than pairs
    ],
    ids=["random", "skewed", "sparse"],
)
@pytest.mark.parametrize("block_m", [4, 16])
def test_align_to_blocks_places_every_pair_once_in_its_experts_blocks(experts, route, block_m):
    pair_count = route.numel()
    sorted_pairs, block_experts = compiled.align_to_blocks(route, experts, block_m)
    assert len(sorted_pairs) == compiled.block_capacity(pair_count, experts, block_m)
    assert len(block_experts) * block_m == len(sorted_pairs)
    real = sorted_pairs < pair_count
    assert sorted(sorted_pairs[real].tolist()) == list(range(pair_count))
    assert torch.all(sorted_pairs[~real] == pair_count)
    # each block holds one expert's pairs, in their order, and experts come in increasing order
    counts = torch.bincount(route.flatten(), minlength=experts)
    used = int(((counts + block_m - 1) // block_m).sum())
    assert torch.all(block_experts[used:] == -1) and torch.all(block_experts[:used] >= 0)
    assert torch.all(block_experts[:used].diff() >= 0)
    flat = route.flatten()
    for b, expert in enumerate(block_experts[:used].tolist()):
        rows = sorted_pairs[b * block_m : (b + 1) * block_m]
        rows = rows[rows < pair_count]
        assert len(rows) > 0 and torch.all(flat[rows] == expert)
        assert torch.all(rows.diff() > 0)
    for expert in range(experts):  # as few blocks as its pairs need
        blocks = (block_experts == expert).nonzero().flatten().tolist()
        assert len(blocks) == -(-int(counts[expert]) // block_m)


# float32: the interpreter multiplies in float32 as the reference does (differences ~1e-6);
# float16: the activations and each pair's output are rounded to float16 (2 ** -11 relative).
# Not bfloat16: the interpreter's tl.dot multiplies bfloat16 tiles as the integers holding them.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3}

# The interpreter's cases: name -> the inputs' arguments and the tiles (None: the default, which
# is decode's here, its BLOCK_K and BLOCK_N beyond these widths). "blocks": tiles smaller than the
# widths (several N tiles and K steps, ragged edges) and an expert whose 20 pairs fill one block
# and pad the next while experts 3 of 5 get none.
SPREAD = torch.stack([torch.zeros(20, dtype=torch.long), torch.arange(20) % 2 + 1], 1)
SPREAD[::7, 1] = 4
SHAPES = {
    "1x4x2x32x32": ((1, 4, 2, 32, 32), {}, None),
    "5x8x2x64x32": ((5, 8, 2, 64, 32), {}, None),
    "16x8x2x64x64": ((16, 8, 2, 64, 64), {}, None),
    "13x6x2x48x40": ((13, 6, 2, 48, 40), {}, None),
    "blocks": ((20, 5, 2, 72, 40), {"seed": 3, "route": SPREAD}, (16, 16, 16, 4, 1)),
}
CASES = {
    f"{name}-{str(dtype).removeprefix('torch.')}": (make_inputs(*shape, dtype, "cpu", **kw), blocks)
    for name, (shape, kw, blocks) in SHAPES.items()
    for dtype in (torch.float32, torch.float16)
}

# run by `interpreted.run_interpreted` in a child process
CHILD = """
import sys, torch
from workbench.kernels.fused_moe import MoeBlocks, fused_moe
cases = torch.load(sys.argv[1])
outputs = {
    name: fused_moe(*inputs, blocks=blocks and MoeBlocks(*blocks))
    for name, (inputs, blocks) in cases.items()
}
torch.save(outputs, sys.argv[2])
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, torch.Tensor]:
    """Each case's output from the kernel run by Triton's interpreter (numpy, on the CPU)."""
    return run_interpreted(tmp_path_factory.mktemp("fused_moe"), CHILD, CASES)


@pytest.mark.parametrize("case", CASES)
def test_interpreted_kernel_matches_the_torch_loop(interpreted, case):
    inputs, _ = CASES[case]
    x = inputs[0]
    y = interpreted[case]
    assert y.shape == x.shape and y.dtype == x.dtype
    tol = TOLERANCE[x.dtype]
    torch.testing.assert_close(y.float(), reference(*inputs), atol=tol, rtol=tol)


def test_no_tokens_give_an_empty_output():
    x, w13, w2, weights, ids = make_inputs(0, 4, 2, 32, 32, torch.float32, "cpu")
    assert compiled.fused_moe(x, w13, w2, weights, ids).shape == (0, 32)


# Qwen3-30B-A3B's expert shapes (128 experts, top 8, hidden 2048, 768 wide) from one decode token
# to a prefill chunk (each of the three tile choices), Mixtral's (8, top 2, 4096, 14336), ragged.
GPU_SHAPES = [
    (1, 128, 8, 2048, 768),
    (64, 128, 8, 2048, 768),
    (512, 128, 8, 2048, 768),
    (2048, 128, 8, 2048, 768),
    (1, 8, 2, 4096, 14336),
    (256, 8, 2, 4096, 14336),
    (13, 6, 2, 80, 40),
]
# bf16: activations and each pair's output rounded to bf16 (2 ** -8 relative); float32: full
# precision dots (no TF32), differing from torch's only in the order of the sums
GPU_TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 1e-4}


@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.gpu
@needs_cuda
def test_gpu_kernel_matches_the_torch_loop(shape, dtype):
    """Within GPU_TOLERANCE, absolute and relative, at every tile choice."""
    inputs = make_inputs(*shape, dtype, "cuda", seed=7)
    y = compiled.fused_moe(*inputs)
    want = reference(*inputs)
    err = (y.float() - want).abs().max().item()
    print(f"\nfused moe {shape} {dtype}: max |err| {err:.2e} (max |y| {want.abs().max():.2f})")
    tol = GPU_TOLERANCE[dtype]
    torch.testing.assert_close(y.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("tokens", [1, 48, 600])
@pytest.mark.gpu
@needs_cuda
def test_gpu_kernel_runs_without_host_sync_and_replays_in_a_cuda_graph(tokens):
    """No host sync (torch's sync debug mode raises on one), and a captured graph replayed on
    new inputs and routing gives what an eager call gives on them."""
    shape = (tokens, 128, 8, 2048, 768)
    x, w13, w2, weights, ids = make_inputs(*shape, torch.bfloat16, "cuda", seed=1)
    compiled.fused_moe(x, w13, w2, weights, ids)  # compiles outside the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        compiled.fused_moe(x, w13, w2, weights, ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        compiled.fused_moe(x, w13, w2, weights, ids)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = compiled.fused_moe(x, w13, w2, weights, ids)
    new_x, _, _, new_weights, new_ids = make_inputs(*shape, torch.bfloat16, "cuda", seed=2)
    x.copy_(new_x)
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    assert torch.equal(y, compiled.fused_moe(new_x, w13, w2, new_weights, new_ids))


def test_the_fused_kernels_are_counted_in_the_experts_family():
    """A profile's kernel breakdown names the fused expert kernels by their Triton names:
    "experts", not "norm/rope/act" (one's name holds "silu") or "other"."""
    from workbench.history.families import family

    for kernel in (compiled.moe_gate_up_silu, compiled.moe_down_weighted):
        assert family(kernel.__name__, "kernel") == "experts"
    assert family("triton_poi_fused_silu_mul_0", "kernel") == "norm/rope/act"
    assert family("ampere_bf16_s16816gemm_bf16_64x64", "kernel") == "matmul"

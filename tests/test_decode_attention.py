"""The Triton decode attention kernel (workbench/kernels/decode_attention.py) against attention
computed in float32 from the KV gathered through the page table: on the CPU through Triton's
interpreter (float32 and float16; one request or several of unequal lengths, slots scattered,
grouped query heads 1, 2 and 8 to a KV head, its KV in one stretch or split, stretches past a
short request's end); on the GPU compiled (bfloat16 at real models' head shapes, in a CUDA
graph)."""

from __future__ import annotations

import contextlib

import pytest
import torch

pytest.importorskip("triton", reason="the decode attention kernel needs triton")

from workbench.kernels import decode_attention as compiled  # noqa: E402

from .interpreted import run_interpreted  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def make_inputs(lens, heads, kv_heads, dim, dtype, device, splits=None, seed=0):
    """A KV cache of scattered slots, a page table whose rows `rows` hold each request's slots,
    and a query per request (scaled so that the softmax is neither flat nor one-hot)."""
    gen = torch.Generator("cpu").manual_seed(seed)
    slots = sum(lens) + 7
    k = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    q = torch.randn(len(lens), heads, dim, generator=gen).to(dtype)
    width = max(lens) + 5
    table = torch.zeros(len(lens) + 2, width, dtype=torch.int32)
    order = torch.randperm(slots, generator=gen).to(torch.int32)
    rows = torch.randperm(len(lens) + 2, generator=gen)[: len(lens)].to(torch.int32)
    taken = 0
    for row, n in zip(rows.tolist(), lens):
        table[row, :n] = order[taken : taken + n]
        taken += n
    lens_t = torch.tensor(lens, dtype=torch.int32)
    tensors = (q, k, v, table, rows, lens_t)
    return tuple(t.to(device) for t in tensors) + (dim**-0.5, splits)


def reference(q, k, v, table, rows, lens, scale, splits=None) -> torch.Tensor:
    heads, kv_heads = q.shape[1], k.shape[1]
    out = []
    for i, (row, n) in enumerate(zip(rows.tolist(), lens.tolist())):
        slots = table[row, :n].long()
        keys = k[slots].float().repeat_interleave(heads // kv_heads, dim=1)  # [n, heads, dim]
        values = v[slots].float().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[i].float(), keys) * scale
        out.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), values))
    return torch.stack(out)


# (KV lengths, heads, KV heads, head dim, splits)
SHAPES = {
    "one-request-1-token": ([1], 2, 2, 16, 1),
    "three-unequal-gqa2": ([5, 70, 33], 4, 2, 16, 1),
    "three-unequal-gqa2-split3": ([5, 70, 33], 4, 2, 16, 3),
    "gqa8-split4": ([100, 64], 16, 2, 32, 4),
    "short-requests-split5": ([2, 40, 1], 2, 1, 16, 5),  # stretches past their ends
    "gqa1-split2-dim64": ([96, 31], 2, 2, 64, 2),
}
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3}
CASES = {
    f"{name}-{str(dtype).removeprefix('torch.')}": make_inputs(*shape[:4], dtype, "cpu", shape[4])
    for name, shape in SHAPES.items()
    for dtype in (torch.float32, torch.float16)
}

CHILD = """
import sys, torch
from workbench.kernels.decode_attention import decode_attention
cases = torch.load(sys.argv[1])
torch.save({name: decode_attention(*inputs) for name, inputs in cases.items()}, sys.argv[2])
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, torch.Tensor]:
    """Each case's output from the kernel run by Triton's interpreter (numpy, on the CPU)."""
    return run_interpreted(tmp_path_factory.mktemp("decode_attention"), CHILD, CASES)


@pytest.mark.parametrize("case", CASES)
def test_interpreted_kernel_matches_attention_through_the_page_table(interpreted, case):
    inputs = CASES[case]
    out = interpreted[case]
    assert out.shape == inputs[0].shape and out.dtype == inputs[0].dtype
    tol = TOLERANCE[inputs[0].dtype]
    torch.testing.assert_close(out.float(), reference(*inputs), atol=tol, rtol=tol)


def test_split_launches_share_one_fixed_buffer_of_counters_and_refuse_more():
    from workbench.kernels.split_counters import MAX_COUNTERS, split_counters

    first = split_counters(torch.device("cpu"), 8, "one launch")
    assert split_counters(torch.device("cpu"), MAX_COUNTERS, "another") is first
    assert first.dtype == torch.int32 and not first.any()
    with pytest.raises(ValueError, match=f"another split needs {MAX_COUNTERS + 1} counters"):
        split_counters(torch.device("cpu"), MAX_COUNTERS + 1, "another")


def test_splits_follow_the_programs_a_gpu_needs_and_bad_ones_are_refused():
    programs = 2 * 132  # an H100's or H200's SMs, twice
    assert compiled.splits_for(8, 8, programs) == 4  # Qwen3-0.6B at batch 8
    assert compiled.splits_for(8, 4, programs) == 8  # Qwen3-30B-A3B
    assert compiled.splits_for(64, 8, programs) == 1
    assert compiled.splits_for(1, 1, programs) == compiled.MAX_SPLITS
    q, k, v, table, rows, lens, scale, _ = make_inputs([3], 3, 2, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="3 query heads over 2 KV heads"):
        compiled.decode_attention(q, k, v, table, rows, lens, scale)
    q, k, v, table, rows, lens, scale, _ = make_inputs([3], 2, 2, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="splits must be 1 to 16, got 17"):
        compiled.decode_attention(q, k, v, table, rows, lens, scale, splits=17)


# real models' heads (query heads, KV heads, head dim) at a few batch sizes, bf16: float32 sums
# of bf16 products in another order than the reference's
GPU_HEADS = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128), "qwen3-30b-a3b": (32, 4, 128)}


@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("model", GPU_HEADS)
@pytest.mark.gpu
@needs_cuda
def test_gpu_kernel_matches_attention_through_the_page_table(model, batch):
    heads, kv_heads, dim = GPU_HEADS[model]
    lens = [
        int(n)
        for n in torch.randint(1, 1500, (batch,), generator=torch.Generator().manual_seed(batch))
    ]
    inputs = make_inputs(lens, heads, kv_heads, dim, torch.bfloat16, "cuda", seed=batch)
    out = compiled.decode_attention(*inputs)
    want = reference(*inputs)
    err = (out.float() - want).abs().max().item()
    print(f"\ndecode attention {model} batch {batch}: max |err| {err:.2e}")
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@needs_cuda
def test_gpu_kernel_replays_in_a_cuda_graph_on_new_lengths():
    """Split launches in a graph: new queries and KV lengths give what a fresh call gives, bit
    for bit (the merge adds the stretches in one order)."""
    q, k, v, table, rows, lens, scale, _ = make_inputs(
        [300, 7, 1200, 64], 16, 8, 128, torch.bfloat16, "cuda", seed=4
    )
    compiled.decode_attention(q, k, v, table, rows, lens, scale)  # compiles outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled.decode_attention(q, k, v, table, rows, lens, scale)
    q.copy_(torch.randn_like(q))
    lens.copy_(torch.tensor([1, 900, 30, 64], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, compiled.decode_attention(q, k, v, table, rows, lens, scale))


@contextlib.contextmanager
def _answered_the_planted_workload(graphs: bool, page_size: int = 16, **options):
    """A Workbench of the planted induction model (two query heads a KV head) with `options`,
    once every answer of the planted workload was the pattern's continuation (chunked prompts
    beside decodes, requests aborted mid-prompt and mid-decode, overlap on and off), decode
    steps replayed as graphs or run eagerly."""
    from workbench import Workbench

    from .planted import run_workload

    wb = Workbench(
        "dummy:qwen3-induction",
        page_size=page_size,
        cuda_graph=graphs,
        num_pages=16384 // page_size,
        max_running_reqs=8,
        cuda_graph_max_bs=8,
        **options,
    )
    try:
        for chunk, policy, overlap in ((16, "mixed", True), (8192, "prefill_first", False)):
            counts = run_workload(wb, chunk, policy, overlap, graphs)
            assert counts["exact"] == counts["outputs"]
        yield wb
    finally:
        wb.close()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_the_engine_answers_the_planted_workload_with_the_triton_kernel(graphs, page_size):
    """`decode_kernel="triton"` in the engine answers the planted workload."""
    with _answered_the_planted_workload(graphs, page_size, decode_kernel="triton"):
        pass


def test_the_triton_kernel_is_refused_where_flashinfer_does_not_run():
    """On the CPU (the torch backend) the option names itself and what is allowed."""
    from workbench import Workbench

    with pytest.raises(ValueError, match="decode_kernel='triton' runs on the FlashInfer backend"):
        Workbench("tiny-qwen3", device="cpu", decode_kernel="triton")
    with pytest.raises(ValueError, match="decode_kernel"):
        Workbench("tiny-qwen3", device="cpu", decode_kernel="cutlass")


def test_flashinfer_decode_takes_cuda_cores_for_small_batches_of_small_groups():
    """The FlashInfer backend's decode kernel by batch size: `decode_tensor_cores` True or False
    decides for every batch; left to the backend, tensor cores for 4 or more query heads a KV
    head, CUDA cores for one, and for 2 or 3 CUDA cores up to 128 requests."""
    from workbench.attention.flashinfer_backend import CUDA_CORES_UP_TO, tensor_cores_above

    assert CUDA_CORES_UP_TO == 128
    for group, asked, above in (
        (2, None, 128),
        (3, None, 128),
        (4, None, 0),
        (8, None, 0),
        (1, None, float("inf")),
        (2, True, 0),
        (1, True, 0),
        (8, False, float("inf")),
    ):
        assert tensor_cores_above(group, asked) == above, (group, asked)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    "tensor_cores", [None, True, False], ids=["by-batch", "tensor-cores", "cuda-cores"]
)
def test_the_engine_answers_the_planted_workload_on_each_flashinfer_decode_kernel(tensor_cores):
    """FlashInfer's decode on CUDA cores and on tensor cores, in graphs and eagerly: the planted
    induction model (two query heads a KV head) answers every request with the pattern's
    continuation, and each wrapper runs on the cores the rule gives its batch size."""
    expect = {None: False, True: True, False: False}[tensor_cores]
    big = {None: True, True: True, False: False}[tensor_cores]  # above 128 requests
    for graphs in (True, False):
        with _answered_the_planted_workload(graphs, decode_tensor_cores=tensor_cores) as wb:
            backend = wb.engine.backend
            wrappers = list(backend.graphs.wrappers.values()) if graphs else []
            wrappers += [backend.decode_wrapper(8)]
            assert [w.use_tensor_cores for w in wrappers] == [expect] * len(wrappers)
            assert backend.decode_wrapper(129).use_tensor_cores is big
            # a run says the rule it ran under (`Engine.kernels`, a saved run's meta)
            words = {None: "CUDA cores up to 128 requests, tensor cores above"}
            words |= {True: "tensor cores", False: "CUDA cores"}
            assert wb.llm.run_meta()["kernels"]["decode_cores"] == words[tensor_cores]
            # CUDA-core graphs are planned by FlashInfer's decode scheduler directly
            replans = backend.graphs._replans.values() if graphs else ()
            assert all(r is not None for r in replans)

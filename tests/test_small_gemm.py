"""The small-batch GEMM Triton kernel (workbench/kernels/small_gemm.py) against `F.linear`: on the
CPU through Triton's interpreter (float32 and float16; ragged edges, bias, leading dimensions),
on the GPU compiled (bfloat16 at decode shapes of real models, in a CUDA graph)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the small-batch GEMM needs triton (pip install triton)")

from workbench.kernels import small_gemm as compiled  # noqa: E402

from .interpreted import run_interpreted  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def make_inputs(lead, n, k, bias, dtype, device, seed=0):
    """x of shape (*lead, k) of order one, W scaled so that outputs are of order one."""
    gen = torch.Generator(device).manual_seed(seed)
    x = torch.randn(*lead, k, generator=gen, device=device).to(dtype)
    w = (torch.randn(n, k, generator=gen, device=device) * k**-0.5).to(dtype)
    b = torch.randn(n, generator=gen, device=device).to(dtype) if bias else None
    return x, w, b


def reference(x, w, b) -> torch.Tensor:
    return F.linear(x.float(), w.float(), None if b is None else b.float())


# rows 1 to 16 (a tile's), columns across several tiles with a ragged last one, K across several
# BLOCK_K steps with a ragged last one, a bias, a leading batch dimension
SHAPES = {
    "1x16x32": ((1,), 16, 32, False),
    "8x40x300": ((8,), 40, 300, False),
    "16x72x513-bias": ((16,), 72, 513, True),
    "2x3x24x64-bias": ((2, 3), 24, 64, True),
    "5x9000x40": ((5,), 9000, 40, False),  # wider tiles past 8,192 columns
}
# K split (`splits`): ragged K within and across splits, ragged columns, a bias, wide tiles
SPLIT_SHAPES = {
    "8x40x1300-split3": (((8,), 40, 1300, False), 3),
    "16x72x2100-bias-split4": (((16,), 72, 2100, True), 4),
    "1x24x520-split2": (((1,), 24, 520, False), 2),
    "5x9000x600-split2": (((5,), 9000, 600, False), 2),
}
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3}
# gated (`gated=True`): x is gate | up of twice K, the input silu(gate) * up
GATED_SHAPES = {
    "8x40x300-gated": (((8,), 40, 300, False), 1),
    "16x72x1300-bias-gated-split3": (((16,), 72, 1300, True), 3),
}


def gated_inputs(shape, dtype, splits):
    """The inputs of `make_inputs` with x widened to gate | up (up from another seed)."""
    x, w, b = make_inputs(*shape, dtype, "cpu")
    up, _, _ = make_inputs(*shape, dtype, "cpu", seed=1)
    return torch.cat([x, up], dim=-1), w, b, splits, True


def gated_reference(x, w, b) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return reference((F.silu(gate) * up).to(x.dtype), w, b)


def dtypes(name: str) -> tuple[torch.dtype, ...]:
    """Both dtypes, but the wide tiles' shapes in float32 alone: the interpreter takes 2-6 s
    for each of them, and their dtype path is the narrow tiles'."""
    return (torch.float32,) if name.startswith("5x9000") else (torch.float32, torch.float16)


CASES = (
    {
        f"{name}-{str(dtype).removeprefix('torch.')}": make_inputs(*shape, dtype, "cpu")
        for name, shape in SHAPES.items()
        for dtype in dtypes(name)
    }
    | {
        f"{name}-{str(dtype).removeprefix('torch.')}": (*make_inputs(*shape, dtype, "cpu"), splits)
        for name, (shape, splits) in SPLIT_SHAPES.items()
        for dtype in dtypes(name)
    }
    | {
        f"{name}-{str(dtype).removeprefix('torch.')}": gated_inputs(shape, dtype, splits)
        for name, (shape, splits) in GATED_SHAPES.items()
        for dtype in dtypes(name)
    }
)
# `pdl=True` (kernels/pdl.py): the first weight tile read before the wait, the rest in the loop;
# the interpreter runs that path without the wait. K of one tile, of several, split, gated.
PDL_CASES = {
    f"{name}-pdl": (*CASES[name][:3], CASES[name][3] if len(CASES[name]) > 3 else None)
    + (len(CASES[name]) == 5, True)
    for name in (
        "1x16x32-float32",
        "16x72x513-bias-float32",
        "8x40x1300-split3-float16",
        "16x72x1300-bias-gated-split3-float32",
    )
}
CASES |= PDL_CASES

# run by `interpreted.run_interpreted` in a child process
CHILD = """
import sys, torch
from workbench.kernels.small_gemm import small_linear
cases = torch.load(sys.argv[1])
torch.save({name: small_linear(*inputs) for name, inputs in cases.items()}, sys.argv[2])
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, torch.Tensor]:
    """Each case's output from the kernel run by Triton's interpreter (numpy, on the CPU)."""
    return run_interpreted(tmp_path_factory.mktemp("small_gemm"), CHILD, CASES)


@pytest.mark.parametrize("case", CASES)
def test_interpreted_kernel_matches_f_linear(interpreted, case):
    x, w, b = CASES[case][:3]
    gated = len(CASES[case]) >= 5 and CASES[case][4]
    y = interpreted[case]
    assert y.shape == (*x.shape[:-1], w.shape[0]) and y.dtype == x.dtype
    tol = TOLERANCE[x.dtype]
    want = gated_reference(x, w, b) if gated else reference(x, w, b)
    torch.testing.assert_close(y.float(), want, atol=tol, rtol=tol)


def test_a_gated_input_must_be_twice_the_weights_width():
    x, w, b = make_inputs((2,), 16, 32, False, torch.float32, "cpu")
    with pytest.raises(
        ValueError, match=r"gate \| up of 2 x 32 features, got x of shape \(2, 32\)"
    ):
        compiled.small_linear(x, w, b, gated=True)


def test_k_is_split_where_the_columns_leave_the_gpu_idle():
    """About two programs an SM (264 on an H100 or H200): dummy Qwen3-0.6B's 1,024-column
    projections split K four ways, its wide ones and Qwen3-8B's do not; a split is at least two
    BLOCK_K steps long."""
    programs = 2 * 132
    assert compiled.split_k(1024, 2048, programs) == 4  # output
    assert compiled.split_k(1024, 3072, programs) == 4  # down
    assert compiled.split_k(6144, 1024, programs) == 1  # gate-up: 384 column blocks
    assert compiled.split_k(4096, 4096, programs) == 1  # 8B's output: 256 column blocks
    assert compiled.split_k(1024, 512, programs) == 1  # K of two steps: nothing to split
    x, w, b = make_inputs((2,), 16, 32, False, torch.float32, "cpu")
    with pytest.raises(ValueError, match="splits must be 1 to 16, got 0"):
        compiled.small_linear(x, w, b, splits=0)


def test_more_rows_than_a_tile_are_refused_naming_the_limit():
    x, w, b = make_inputs((compiled.MAX_ROWS + 1,), 16, 32, False, torch.float32, "cpu")
    with pytest.raises(ValueError, match=f"at most {compiled.MAX_ROWS} rows"):
        compiled.small_linear(x, w, b)


# A decode step's projections of dummy Qwen3-0.6B and Qwen3-8B (fused QKV, output, fused
# gate-up, down) at batch 1, 8 and 16. bf16: inputs rounded to bf16, float32 sums in another
# order than cuBLAS's: within 1e-2 of outputs of order one.
GPU_SHAPES = [
    (m, n, k)
    for m in (1, 8, 16)
    for n, k in ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (6144, 4096))
] + [(8, 8192, 4096), (8, 24576, 4096), (8, 4096, 12288)]


@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.gpu
@needs_cuda
def test_gpu_kernel_matches_f_linear(shape):
    m, n, k = shape
    x, w, b = make_inputs((m,), n, k, False, torch.bfloat16, "cuda", seed=5)
    y = compiled.small_linear(x, w, b)
    want = reference(x, w, b)
    err = (y.float() - want).abs().max().item()
    print(f"\nsmall gemm {shape}: max |err| {err:.2e} (max |y| {want.abs().max():.2f})")
    torch.testing.assert_close(y.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@needs_cuda
def test_gpu_kernel_replays_in_a_cuda_graph_on_new_inputs():
    x, w, b = make_inputs((8,), 1024, 2048, True, torch.bfloat16, "cuda", seed=2)
    compiled.small_linear(x, w, b)  # compiles outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = compiled.small_linear(x, w, b)
    fresh, _, _ = make_inputs((8,), 1024, 2048, False, torch.bfloat16, "cuda", seed=3)
    x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, compiled.small_linear(x, w, b))  # one order of sums: the same bits


def test_the_layers_limit_is_the_kernels():
    from workbench.layers.parallel import SMALL_ROWS

    assert SMALL_ROWS == compiled.MAX_ROWS


def test_small_gemm_is_off_where_no_gpu_is():
    from workbench.config import EngineConfig

    assert not EngineConfig(model="tiny-qwen3", small_gemm=True, device="cpu").small_gemm_enabled


@pytest.fixture(scope="module")
def planted_engines():
    from workbench import Workbench

    engines = {}

    def engine(graphs: bool):
        if graphs not in engines:
            engines[graphs] = Workbench(
                "dummy:qwen3-induction",
                small_gemm=True,
                cuda_graph=graphs,
                num_pages=16384,
                max_running_reqs=8,
                cuda_graph_max_bs=8,
            )
        return engines[graphs]

    yield engine
    for wb in engines.values():
        wb.close()


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("chunk, policy", [(16, "mixed"), (8192, "prefill_first")])
@pytest.mark.gpu
@needs_cuda
def test_the_planted_model_answers_with_the_small_gemm(planted_engines, graphs, chunk, policy):
    """The GPU matrix's workload with the layers' small batches on the kernel: every answer the
    pattern's continuation, aborts and integrity as there (`tests/planted.py`)."""
    from .planted import run_workload

    wb = planted_engines(graphs)
    layers = wb.engine.model.layers
    assert layers[0].self_attn.qkv_proj.small_gemm and layers[-1].mlp.down_proj.small_gemm
    run_workload(wb, chunk, policy, overlap=True, graphs=graphs)


@pytest.mark.gpu
@needs_cuda
def test_gpu_a_chain_launched_with_pdl_gives_the_bits_of_one_launched_without():
    """A decode layer's GEMMs in a chain, each reading the last one's output (QKV-like, output
    split over K, gate-up, gated down split over K), replayed in a CUDA graph with programmatic
    dependent launch and without: the same bits. A kernel that read its input before the wait
    (`kernels/pdl.py`) would read the last replay's values and differ here."""
    from workbench.kernels.pdl import pdl_supported

    if not pdl_supported(torch.device("cuda")):
        pytest.skip("PDL needs compute capability 9.0 or later")
    gen = torch.Generator("cuda").manual_seed(7)

    def weight(n, k):
        return (torch.randn(n, k, generator=gen, device="cuda") * k**-0.5).bfloat16()

    w_in, w_out = weight(2048, 1024), weight(1024, 2048)
    w_gate_up, w_down = weight(6144, 1024), weight(1024, 3072)
    x = torch.randn(8, 1024, generator=gen, device="cuda").bfloat16()

    def chain(pdl):
        h = compiled.small_linear(x, w_in, pdl=pdl)
        h = compiled.small_linear(h, w_out, splits=4, pdl=pdl)
        h = compiled.small_linear(h, w_gate_up, pdl=pdl)
        return compiled.small_linear(h, w_down, splits=4, gated=True, pdl=pdl)

    outputs = {}
    for pdl in (False, True):
        chain(pdl)  # compiles outside the graph
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain(pdl)
        replays = []
        for seed in range(3):
            x.copy_(torch.randn(8, 1024, generator=gen.manual_seed(seed), device="cuda"))
            graph.replay()
            replays.append(out.clone())
        outputs[pdl] = torch.stack(replays)
    assert torch.equal(outputs[True], outputs[False])
    assert not torch.equal(outputs[True][0], outputs[True][1])  # (the inputs did change)


@pytest.mark.gpu
@needs_cuda
def test_gpu_the_planted_model_answers_with_every_triton_kernel_under_pdl():
    """`pdl=True` with the small-batch GEMM and the Triton decode attention: the decode layer's
    chain of Triton and FlashInfer kernels launched with PDL, replayed in graphs; every answer
    the pattern's continuation, aborts and integrity as in the GPU matrix."""
    from workbench import Workbench

    from .planted import run_workload

    wb = Workbench(
        "dummy:qwen3-induction",
        small_gemm=True,
        decode_kernel="triton",
        pdl=True,
        num_pages=16384,
        max_running_reqs=8,
        cuda_graph_max_bs=8,
    )
    try:
        assert wb.engine.config.pdl_enabled == (torch.cuda.get_device_capability()[0] >= 9)
        for chunk, policy, overlap in ((16, "mixed", True), (8192, "prefill_first", False)):
            counts = run_workload(wb, chunk, policy, overlap, graphs=True)
            assert counts["exact"] == counts["outputs"]
    finally:
        wb.close()


def test_pdl_is_off_where_no_gpu_is():
    from workbench.config import EngineConfig

    assert not EngineConfig(model="tiny-qwen3", pdl=True, device="cpu").pdl_enabled
    with pytest.raises(ValueError, match="pdl=True needs a CUDA GPU"):
        x, w, _ = make_inputs((2,), 16, 32, False, torch.float32, "cpu")
        compiled.small_linear(x, w, pdl=True)

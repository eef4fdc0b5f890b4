"""A decode step's GEMMs alone, against what reading their weights must take.

    python benchmarks/decode_gemms.py [--model dummy:qwen3-0.6b] [--batch 8 64 256]
                                      [--blas cublas cublaslt triton triton-pdl triton-1]

For each projection of one decoder layer of a dense model (fused QKV, output, fused gate-up,
down) and the LM head, at each batch size: the device's time of one `F.linear` in bf16 (replayed
in a CUDA graph: CUDA events around one call time its launch, 24-40 us at batch 8 on an H100
where the device takes 4-6 us) under each BLAS library torch can pick (`torch.backends.cuda.
preferred_blas_library`) and of the engine's small-batch Triton kernel (`small_gemm`, batches
of up to 16 rows; the engine keeps the LM head on cuBLAS; "triton" splits K as the kernel
chooses, "triton-pdl" the same launched with programmatic dependent launch (`kernels/pdl.py`:
each of the graph's calls may start in the tail of the one before, reading its weights; Hopper
and later), "triton-N" N ways), the bound (its weights, inputs and
outputs once at the device's bandwidth, or its FLOPs at its peak: `history/roofline.py`'s spec
of the GPU it runs on, or `--device-spec`'s), and the ratio; then a decode step's GEMMs in all
(the layer's times the number of layers, and the LM head); and the down projection with its
SiLU-and-mul (two launches, or one of the small kernel with `gated`: "silu+dn", not in the
step's total). On a CPU it times the same shapes with
`time.perf_counter` (no bound: a check that the script runs).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F
from fused_ops import graph_time

from workbench.history.roofline import DEVICES, roofline_spec
from workbench.layers.parallel import SMALL_ROWS
from workbench.models import ModelConfig, resolve


def projections(cfg: ModelConfig) -> list[tuple[str, int, int, int]]:
    """(name, out features, in features, launches per decode step) of a dense decode step."""
    h, heads, kv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    layers = cfg.num_layers
    return [
        ("qkv", (heads + 2 * kv) * d, h, layers),
        ("o", h, heads * d, layers),
        ("gate_up", 2 * cfg.intermediate_size, h, layers),
        ("down", h, cfg.intermediate_size, layers),
        ("lm_head", cfg.vocab_size, h, 1),
    ]


def timed_us(fn, cuda: bool, repeat: int = 50) -> float:
    """On a GPU the device's time per call, replayed in a CUDA graph of 20 calls as the engine
    replays its decode steps (`kernels.graph_time`); else the median of `repeat` runs after 5 on
    the wall clock."""
    if cuda:
        return graph_time(fn, replays=repeat // 2, per_graph=20) * 1e6
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e6)
    return statistics.median(times)


def bound_us(m: int, n: int, k: int, spec, dtype_bytes: int) -> float:
    nbytes = (n * k + m * k + m * n) * dtype_bytes
    if spec is None:  # a CPU, or a GPU of no known spec
        return float("nan")
    return max(nbytes / spec.bandwidth, 2 * m * n * k / spec.flops) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="dummy:qwen3-0.6b")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument(
        "--blas",
        nargs="+",
        default=["cublas", "cublaslt", "triton", "triton-pdl", "triton-1"],
        help="triton: the engine's small-batch kernel (`small_gemm`; batches of up to 16 rows), "
        "K split as `split_k` chooses; triton-pdl: launched with PDL (compute capability 9.0 "
        "and later); "
        "triton-N: split N ways (triton-1: not split)",
    )
    parser.add_argument(
        "--device-spec", choices=sorted(DEVICES), help="the bound's GPU (default: the one here)"
    )
    args = parser.parse_args(argv)
    cfg = ModelConfig.from_dir(resolve(args.model))
    cuda = torch.cuda.is_available()
    dev, dtype = torch.device("cuda" if cuda else "cpu"), torch.bfloat16
    spec = roofline_spec(dev, args.device_spec)
    blas = args.blas if cuda else ["cpu"]
    weights = {
        name: torch.randn(n, k, device=dev, dtype=dtype) * 0.02
        for name, n, k, _ in projections(cfg)
    }
    against = f", bounds of the {spec.name}" if spec else ""
    print(
        f"{args.model}: a decode step's GEMMs in bf16 on {dev} ({cfg.num_layers} layers{against})"
    )
    head = f"{'batch':>5} {'gemm':<8} {'n x k':>13} {'bound us':>9}"
    print(head + "".join(f" {b + ' us':>12} {'x':>6}" for b in blas))
    for m in args.batch:
        x = torch.randn(m, cfg.hidden_size, device=dev, dtype=dtype)
        wide = torch.randn(
            m, max(cfg.intermediate_size, cfg.num_heads * cfg.head_dim), device=dev, dtype=dtype
        )
        step = {b: 0.0 for b in blas}
        step_bound = 0.0
        for name, n, k, count in projections(cfg):
            inputs = x if k == cfg.hidden_size else wide[:, :k].contiguous()
            bound = bound_us(m, n, k, spec, dtype.itemsize)
            step_bound += bound * count
            cells = []
            for library in blas:
                if library.startswith("triton") and m > SMALL_ROWS:
                    step[library] = float("nan")
                    cells.append(f" {'-':>12} {'':>6}")
                    continue
                if library.startswith("triton"):
                    linear = _triton_linear(library)
                else:
                    linear = F.linear
                    if cuda:
                        torch.backends.cuda.preferred_blas_library(library)
                us = timed_us(lambda w=weights[name], a=inputs, f=linear: f(a, w), cuda)
                step[library] += us * count
                cells.append(
                    f" {us:>12.1f} {us / bound:>5.1f}x" if cuda else f" {us:>12.1f} {'':>6}"
                )
            print(f"{m:>5} {name:<8} {f'{n} x {k}':>13} {bound:>9.2f}" + "".join(cells))
        _print_silu_down(cfg, m, blas, weights["down"], spec, cuda)
        total = "".join(
            f" {step[b]:>12.0f} {step[b] / step_bound:>5.1f}x" if cuda else f" {step[b]:>12.0f}"
            for b in blas
        )
        print(f"{m:>5} {'a step':<8} {'':>13} {step_bound:>9.1f}{total}")
    if cuda:
        torch.backends.cuda.preferred_blas_library("cublas")


def _triton_linear(library: str, **fixed):
    """The small-batch kernel as a "triton", "triton-pdl" or "triton-N" column runs it."""
    from workbench.kernels.small_gemm import small_linear

    suffix = library.partition("-")[2]
    options = {"pdl": True} if suffix == "pdl" else {"splits": int(suffix)} if suffix else {}
    return functools.partial(small_linear, **fixed, **options)


def _print_silu_down(cfg: ModelConfig, m: int, blas: list[str], weight, spec, cuda: bool) -> None:
    """The down projection with the SiLU-and-mul before it (not in the step's total): two
    launches under a BLAS library (FlashInfer's `silu_and_mul` where installed, else torch's),
    one for the small-batch kernel, which computes silu(gate) * up as it reads (`gated`)."""
    n, k = weight.shape
    gate_up = torch.randn(m, 2 * k, device=weight.device, dtype=weight.dtype)
    try:
        from flashinfer.activation import silu_and_mul
    except ImportError:

        def silu_and_mul(x):
            gate, up = x.chunk(2, dim=-1)
            return F.silu(gate) * up

    bound = bound_us(m, n, k, spec, weight.dtype.itemsize)
    cells = []
    for library in blas:
        if library.startswith("triton") and m > SMALL_ROWS:
            cells.append(f" {'-':>12} {'':>6}")
            continue
        if library.startswith("triton"):
            fn = functools.partial(_triton_linear(library, gated=True), gate_up, weight)
        else:
            if cuda:
                torch.backends.cuda.preferred_blas_library(library)

            def fn():
                return F.linear(silu_and_mul(gate_up), weight)

        us = timed_us(fn, cuda)
        cells.append(f" {us:>12.1f} {us / bound:>5.1f}x" if cuda else f" {us:>12.1f} {'':>6}")
    print(f"{m:>5} {'silu+dn':<8} {f'{n} x {k}':>13} {bound:>9.2f}" + "".join(cells))


if __name__ == "__main__":
    main()

"""Fused FlashInfer kernels against plain torch, op by op, at decode and prefill shapes.

    python -m workbench.bench.kernels [--model dummy:qwen3-0.6b]

Each op runs through the model's own layer modules with `fused` off and on; the table prints the
median time of 50 runs (CUDA events) and the largest difference between the two outputs.
"""

from __future__ import annotations

import argparse

import torch

from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary
from ..models import ModelConfig, resolve


def _time(fn, repeat: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def compare(name: str, module: torch.nn.Module, args: tuple, first_output: bool) -> tuple:
    """Time `module(*args)` with `fused` off and on; in-place kernels reuse the same inputs."""
    results = {}
    for fused in (False, True):
        module.fused = fused
        with torch.inference_mode():
            out = module(*[a.clone() for a in args])
            results[fused] = (_time(lambda: module(*args)), out[0] if first_output else out)
    diff = (results[True][1].float() - results[False][1].float()).abs().max().item()
    return name, results[False][0], results[True][0], diff


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="dummy:qwen3-0.6b")
    args = parser.parse_args(argv)
    cfg = ModelConfig.from_dir(resolve(args.model))
    dev, dtype = torch.device("cuda"), torch.bfloat16
    h, d = cfg.hidden_size, cfg.head_dim
    with torch.device(dev):
        norm = RMSNorm(h, cfg.rms_norm_eps).to(dtype)
        mlp = GatedMLP(h, cfg.intermediate_size).to(dtype)
        rope = Rotary(d, 8192, cfg.rope_theta, cfg.rope_scaling)
    print(
        f"{'op':<28} {'tokens':>6} {'torch us':>9} {'fused us':>9} {'speedup':>8} {'max diff':>9}"
    )
    for n in (256, 8192):

        def x(rows: int = n, *shape: int) -> torch.Tensor:
            return torch.randn(rows, *(shape or (h,)), device=dev, dtype=dtype)

        positions = torch.randint(0, 8192, (n,), device=dev)
        rows = [
            compare("rmsnorm", norm, (x(),), False),
            compare("add + rmsnorm", norm, (x(), x()), True),
            compare("silu_and_mul (+ MLP GEMMs)", mlp, (x(),), False),
            compare(
                "rope (q and k)",
                rope,
                (positions, x(n, cfg.num_heads, d), x(n, cfg.num_kv_heads, d)),
                True,
            ),
        ]
        for name, slow, fast, diff in rows:
            speedup = slow / fast
            print(f"{name:<28} {n:>6} {slow:>9.1f} {fast:>9.1f} {speedup:>7.2f}x {diff:>9.4f}")


if __name__ == "__main__":
    main()

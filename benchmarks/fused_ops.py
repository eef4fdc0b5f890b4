"""Fused FlashInfer kernels against plain torch, op by op, at decode and prefill shapes.

    python benchmarks/fused_ops.py [--model dummy:qwen3-0.6b]

Each op runs through the model's own layer modules with `fused` off and on; the table prints the
median time of 50 runs (CUDA events) and the largest difference between the two outputs.
"""

from __future__ import annotations

import argparse
import time

import torch

from workbench.layers.mlp import GatedMLP
from workbench.layers.norm import RMSNorm
from workbench.layers.rotary import Rotary
from workbench.models import ModelConfig, resolve


def graph_time(fn, replays: int = 20, per_graph: int = 10) -> float:
    """Seconds per call of `fn`, replayed in a CUDA graph of `per_graph` calls: the device's
    time, where CUDA events around one call of a small kernel time its launch."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (replays * per_graph)


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


def compare_qk_rope(model_cfg: ModelConfig, n: int, dev: torch.device, dtype: torch.dtype) -> tuple:
    """q/k norm + RoPE + K/V store: FlashInfer's fused norm and rope kernels with index_copy
    stores (seven launches with the copies) against the one Triton kernel."""
    from workbench.kernels.qk_norm_rope import qk_norm_rope_store

    h, kvh, d = model_cfg.num_heads, model_cfg.num_kv_heads, model_cfg.head_dim
    with torch.device(dev):
        q_norm = RMSNorm(d, model_cfg.rms_norm_eps).to(dtype)
        k_norm = RMSNorm(d, model_cfg.rms_norm_eps).to(dtype)
        rope = Rotary(d, 8192, model_cfg.rope_theta, model_cfg.rope_scaling)
        qkv = torch.randn(n, (h + 2 * kvh) * d, dtype=dtype)
        positions = torch.randint(0, 8192, (n,))
        slots = torch.randperm(4 * n)[:n]
        k_cache = torch.zeros(4 * n, kvh, d, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
    for m in (q_norm, k_norm, rope):
        m.fused = True

    def eager() -> torch.Tensor:
        q, k, v = qkv.split([h * d, kvh * d, kvh * d], dim=-1)
        q, k = q_norm(q.view(n, h, d)), k_norm(k.view(n, kvh, d))
        q, k = rope(positions, q, k)
        k_cache.index_copy_(0, slots, k)
        v_cache.index_copy_(0, slots, v.view(n, kvh, d))
        return q

    def fused() -> torch.Tensor:
        return qk_norm_rope_store(
            qkv,
            positions,
            rope.cos,
            rope.sin,
            q_norm.weight,
            k_norm.weight,
            model_cfg.rms_norm_eps,
            slots,
            k_cache,
            v_cache,
            h,
        )

    with torch.inference_mode():
        diff = (eager().float() - fused().float()).abs().max().item()
        return "q/k norm + rope + kv store", _time(eager), _time(fused), diff


def compare_sampling(n: int, vocab: int, dev: torch.device) -> tuple:
    """Temperature sampling of n rows: the torch exponential race against the Triton kernel.
    The draws differ (different noise), so the last column is the gap in mean chosen logit."""
    from workbench.core import Req, SamplingParams
    from workbench.engine.sampler import Sampler
    from workbench.kvcache.base import CacheHandle

    reqs = [
        Req(i, [1, 2], 2, 0, 0, SamplingParams(temperature=0.6), CacheHandle()) for i in range(n)
    ]
    for r in reqs:
        r.complete_one()
    logits = torch.randn(n, vocab, device=dev, dtype=torch.bfloat16)
    results = {}
    for fused in (False, True):
        sampler = Sampler(vocab, dev, seed=0, fused=fused)
        args = sampler.prepare(reqs)
        tokens = sampler.sample(logits, args)
        chosen = logits.gather(1, tokens.long()[:, None]).float().mean().item()
        results[fused] = (_time(lambda s=sampler, a=args: s.sample(logits, a)), chosen)
    diff = abs(results[True][1] - results[False][1])
    return "sampling T=0.6 (vocab row)", results[False][0], results[True][0], diff


def first_calls(model_cfg: ModelConfig, dev: torch.device) -> None:
    """Seconds of each Triton kernel's first call: its compile on a fresh machine (Triton
    caches compiled kernels under ~/.triton, so a second process skips it)."""
    import time

    for name, fn in (
        ("q/k norm + rope + kv store", lambda: compare_qk_rope(model_cfg, 8, dev, torch.bfloat16)),
        ("sampling", lambda: compare_sampling(8, model_cfg.vocab_size, dev)),
    ):
        start = time.perf_counter()
        fn()
        print(
            f"first call of the {name} kernel (with its compile): "
            f"{time.perf_counter() - start:.1f} s"
        )


def tune_sampling(n: int, vocab: int, dev: torch.device) -> None:
    """The sampling kernel's time at batch n over block size, segment and warps."""
    from workbench.kernels.sampling import BLOCK, NUM_WARPS, SEGMENT, race_sample

    logits = torch.randn(n, vocab, device=dev, dtype=torch.bfloat16)
    temperatures = torch.full((n,), 0.6, device=dev)
    keys = torch.arange(n, device=dev)
    results = []
    for block in (1024, 2048):
        for blocks in (4, 8, 16):
            for warps in (4, 8):
                t = _time(
                    lambda b=block, s=block * blocks, w=warps: race_sample(
                        logits, temperatures, keys, b, s, w
                    ),
                    repeat=20,
                )
                results.append((t, block, block * blocks, warps))
    results.sort()
    print(f"sampling kernel at batch {n}, fastest first (us, block, segment, warps):")
    print("  " + ", ".join(f"{t:.0f} {b} {s} {w}" for t, b, s, w in results[:8]))
    default = next(t for t, *c in results if tuple(c) == (BLOCK, SEGMENT, NUM_WARPS))
    print(f"  slowest {results[-1][0]:.0f}; in use ({BLOCK}, {SEGMENT}, {NUM_WARPS}) {default:.0f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="dummy:qwen3-0.6b")
    args = parser.parse_args(argv)
    model_cfg = ModelConfig.from_dir(resolve(args.model))
    dev, dtype = torch.device("cuda"), torch.bfloat16
    h, d = model_cfg.hidden_size, model_cfg.head_dim
    with torch.device(dev):
        norm = RMSNorm(h, model_cfg.rms_norm_eps).to(dtype)
        mlp = GatedMLP(h, model_cfg.intermediate_size).to(dtype)
        rope = Rotary(d, 8192, model_cfg.rope_theta, model_cfg.rope_scaling)
    first_calls(model_cfg, dev)
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
                (positions, x(n, model_cfg.num_heads, d), x(n, model_cfg.num_kv_heads, d)),
                True,
            ),
        ]
        rows.append(compare_qk_rope(model_cfg, n, dev, dtype))
        if n == 256:
            rows.append(compare_sampling(n, model_cfg.vocab_size, dev))
        for name, slow, fast, diff in rows:
            speedup = slow / fast
            print(f"{name:<28} {n:>6} {slow:>9.1f} {fast:>9.1f} {speedup:>7.2f}x {diff:>9.4f}")
    tune_sampling(256, model_cfg.vocab_size, dev)


if __name__ == "__main__":
    main()

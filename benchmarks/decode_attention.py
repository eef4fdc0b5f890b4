"""FlashInfer's decode attention choices, alone, at a model's head shape (GPU only).

    python benchmarks/decode_attention.py [--model dummy:qwen3-0.6b ...] [--batch 8 64 256]

At each batch size, about 612 KV tokens a request (nano-vllm's workload mid-run: 156,674 at batch
256), one layer's KV in the engine's layout (K and V apart, token slots in a random order), each
kernel replayed in a CUDA graph: the decode wrapper on CUDA cores and on tensor cores
(FlashInfer's "fa2" and its default backend), the same as the engine's graphs make it
(`use_cuda_graph=True`: fixed buffers, a work layout fixed for the batch size; also with the KV
split off, `disable_split_kv`), and the prefill wrapper used for decode ("fa2" and the
default), at page sizes 1 and 16; and the workbench's Triton kernel (`kernels/decode_attention.py`:
no plan, the token-granular page table; split as it chooses and not split, and launched with
programmatic dependent launch, where each replayed call may start in the tail of the one before:
`kernels/pdl.py`). Prints ms per layer,
the KV read in TB/s, and the host time of `plan()` (0 for the Triton kernel: it has none).
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from fused_ops import graph_time

from workbench.models import ModelConfig, resolve

KV_PER_REQUEST = 156_674 / 256  # nano-vllm's workload mid-run
WORKSPACE = 256 * 2**20


def kv_lens(batch: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    lens = [rng.randint(100, 1024) + rng.randint(0, 1024) // 2 for _ in range(batch)]
    scale = KV_PER_REQUEST * batch / sum(lens)
    return [max(1, int(n * scale)) for n in lens]


def host_time(fn, repeat: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    seconds = (time.perf_counter() - start) / repeat
    torch.cuda.synchronize()
    return seconds


def measure(
    model_cfg: ModelConfig, page: int, lens: list[int], dtype=torch.bfloat16
) -> list[tuple]:
    """(kernel, ms per layer, TB/s, host plan ms) of each choice at this page size."""
    import flashinfer

    dev = torch.device("cuda")
    heads, kv_heads, dim = model_cfg.num_heads, model_cfg.num_kv_heads, model_cfg.head_dim
    pages_per = [-(-n // page) for n in lens]
    num_pages = sum(pages_per)
    k = torch.randn(num_pages + 1, page, kv_heads, dim, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    indices = torch.randperm(num_pages, device=dev, dtype=torch.int32)
    indptr = torch.tensor([0, *torch.tensor(pages_per).cumsum(0).tolist()], dtype=torch.int32)
    last = torch.tensor([(n - 1) % page + 1 for n in lens], dtype=torch.int32)
    q = torch.randn(len(lens), heads, dim, device=dev, dtype=dtype)
    kv_bytes = sum(lens) * kv_heads * dim * 2 * dtype.itemsize
    workspace = torch.zeros(WORKSPACE, dtype=torch.uint8, device=dev)
    shape = dict(q_data_type=dtype, kv_data_type=dtype)
    rows = []
    for name, tensor_cores, backend in (
        ("decode, CUDA cores, fa2", False, "fa2"),
        ("decode, tensor cores, fa2", True, "fa2"),
        ("decode, tensor cores, default", True, "auto"),
    ):
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=tensor_cores, backend=backend
        )

        def plan(w=wrapper):
            w.plan(indptr, indices, last, heads, kv_heads, dim, page, **shape)

        rows.append(_row(name, wrapper, plan, q, (k, v), kv_bytes))
    for name, tensor_cores, no_split in (
        ("graph wrapper, CUDA cores", False, False),
        ("graph wrapper, tensor cores", True, False),
        ("graph wrapper, tensor cores, no split", True, True),
    ):  # the engine's: fixed buffers, a work layout fixed for this batch size
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=indptr.to(dev),
            paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last.to(dev),
            backend="fa2",
        )

        def plan(w=wrapper, whole=no_split):  # no split: one program per request and KV head
            split = {"disable_split_kv": True} if whole else {}
            w.plan(indptr, indices, last, heads, kv_heads, dim, page, **shape, **split)

        rows.append(_row(name, wrapper, plan, q, (k, v), kv_bytes))
    rows += _triton_rows(k, v, q, indices, pages_per, lens, page, kv_bytes)
    qo = torch.arange(len(lens) + 1, dtype=torch.int32)
    for name, backend in (("prefill wrapper, fa2", "fa2"), ("prefill wrapper, default", "auto")):
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)

        def plan(w=wrapper):
            w.plan(qo, indptr, indices, last, heads, kv_heads, dim, page, causal=True, **shape)

        rows.append(_row(name, wrapper, plan, q, (k, v), kv_bytes))
    return rows


def _triton_rows(k, v, q, indices, pages_per, lens, page, kv_bytes) -> list[tuple]:
    """The workbench's Triton kernel (`kernels/decode_attention.py`) on the same KV, through a
    token-granular page table as the engine keeps it; split as it chooses and not split, and a
    few other tiles."""
    from workbench.kernels.decode_attention import decode_attention

    dev, dim = q.device, q.shape[-1]
    kv_heads = k.shape[2]
    width = max(pages_per) * page
    table = torch.zeros(len(lens), width, dtype=torch.int32, device=dev)
    first = 0
    for i, count in enumerate(pages_per):
        pages = indices[first : first + count].long()
        table[i, : count * page] = (
            pages[:, None] * page + torch.arange(page, device=dev)
        ).flatten()
        first += count
    rows = torch.arange(len(lens), dtype=torch.int32, device=dev)
    lens_d = torch.tensor(lens, dtype=torch.int32, device=dev)
    k_slots, v_slots = k.view(-1, kv_heads, dim), v.view(-1, kv_heads, dim)
    want = []  # attention in float32 through the table, to check each choice against
    group = q.shape[1] // kv_heads
    for i, n in enumerate(lens):
        slots = table[i, :n].long()
        keys = k_slots[slots].float().repeat_interleave(group, dim=1)
        values = v_slots[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[i].float(), keys) * dim**-0.5
        want.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), values))
    want = torch.stack(want)
    out = []
    choices = (  # name, splits, block_n, num_warps, num_stages, pdl
        ("triton (kernels/decode_attention.py)", None, 32, 4, None, False),
        ("triton, PDL", None, 32, 4, None, True),
        ("triton, no split", 1, 32, 4, None, False),
        # more programs than `splits_for`'s two an SM: more warps in flight for the KV's latency
        ("triton, 8 splits", 8, 32, 4, None, False),
        ("triton, 16 splits", 16, 32, 4, None, False),
        ("triton, 16 splits, 16-token blocks", 16, 16, 4, None, False),
        ("triton, 16-token blocks", None, 16, 4, None, False),
        ("triton, 64-token blocks", None, 64, 4, None, False),
        ("triton, 2 warps", None, 32, 2, None, False),
        ("triton, 8 warps", None, 32, 8, None, False),
        ("triton, 2 stages", None, 32, 4, 2, False),
        ("triton, 4 stages", None, 32, 4, 4, False),
    )
    for name, splits, block_n, warps, stages, pdl in choices:
        try:

            def run(s=splits, n=block_n, w=warps, st=stages, pdl=pdl):
                return decode_attention(
                    q, k_slots, v_slots, table, rows, lens_d, dim**-0.5, s, n, w, st, pdl=pdl
                )

            seconds = graph_time(run)
            name += f" (max |diff| {(run().float() - want).abs().max().item():.1e})"
        except Exception as exc:
            out.append(
                (name, float("nan"), float("nan"), float("nan"), f"{type(exc).__name__}: {exc}")
            )
            continue
        out.append((name, seconds * 1e3, kv_bytes / seconds / 1e12, 0.0, ""))
    return out


def _row(name: str, wrapper, plan, q, kv, kv_bytes: int) -> tuple:
    try:
        plan_s = host_time(plan)
        plan()
        seconds = graph_time(lambda: wrapper.run(q, kv))
    except Exception as exc:  # a backend this GPU or FlashInfer build does not have
        return name, float("nan"), float("nan"), float("nan"), f"{type(exc).__name__}: {exc}"
    return name, seconds * 1e3, kv_bytes / seconds / 1e12, plan_s * 1e3, ""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", nargs="+", default=["dummy:qwen3-0.6b", "dummy:qwen3-8b"])
    p.add_argument("--page-size", type=int, nargs="+", default=[1, 16])
    p.add_argument("--batch", type=int, nargs="+", default=[8, 64, 256])
    args = p.parse_args(argv)
    print(f"bf16, {torch.cuda.get_device_name()}")
    for batch in args.batch:
        lens = kv_lens(batch)
        print(f"batch {batch}, {sum(lens):,} KV tokens")
        for model in args.model:
            model_cfg = ModelConfig.from_dir(resolve(model))
            for page in args.page_size:
                rows = measure(model_cfg, page, lens)
                for name, ms, tbs, plan_ms, error in rows:
                    where = f"{model} batch {batch:3d} page {page:2d} {name:30s}"
                    if error:
                        print(f"{where} unavailable: {error[:120]}", flush=True)
                    else:
                        print(f"{where} {ms:.4f} ms/layer {tbs:.2f} TB/s plan {plan_ms:.3f} ms")


if __name__ == "__main__":
    main()

"""Decode attention over the paged KV cache in one Triton launch, for small batches.

Why: at batch 8 FlashInfer's decode took 0.64 ms of dummy Qwen3-0.6B's 1.59 ms decode step on
the H200, about 23 us a layer where reading the layer's KV takes about 4 (its plan splits each
request's KV, then a second kernel merges the pieces). Here a program takes one request, one KV
head (all the query heads that share it: `BLOCK_G` rows of one tensor-core tile) and one of
`SPLITS` stretches of the request's KV, reads the stretch's slots from the token-granular page
table (no plan, nothing to rebuild for a graph replay), and keeps an online softmax. With one
split it writes the output; with more, each program leaves its stretch's output and log-sum-exp
in float32 and the program of a (request, head) that counts last merges them in split order: one
launch, and the same bits whichever stretch finished last. The engine's decode steps take it
with `decode_kernel="triton"` (the FlashInfer backend).

Measured (H100, 2026-12-06, `benchmarks/decode_attention.py --page-size 16`, dummy Qwen3-0.6B's
heads, a layer replayed in a CUDA graph): at batch 8 (4,892 KV tokens) 12.4 us a layer against
13.3 for FlashInfer's graph wrapper on tensor cores (the engine's choice for grouped heads) and
12.0 on CUDA cores; at batch 64 70.9 against 62.2-66.9 (63.3 with 64-token blocks). So it is
not the step's way to its bound: each is within a few microseconds of the others.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import check_pdl, launch_options, wait_for_previous
from .split_counters import split_counters

BLOCK_N = 32  # KV tokens a program reads per iteration
MAX_SPLITS = 16
_LOG2E = 1.4426950408889634


@triton.jit
def _decode_attention(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    rows_ptr,
    lens_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    count_ptr,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_table,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous(PDL)  # (kernels/pdl.py: before anything another kernel writes)
    b, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    num_kv_heads = tl.num_programs(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    g_ok = g < GROUP
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_ok[:, None],
        other=0.0,
    )
    kv_len = tl.load(lens_ptr + b)
    row = tl.load(rows_ptr + b).to(tl.int64)
    stretch = tl.cdiv(tl.cdiv(kv_len, SPLITS), BLOCK_N) * BLOCK_N
    start = split * stretch
    end = tl.minimum(kv_len, start + stretch)
    m = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l = tl.zeros((BLOCK_G,), dtype=tl.float32)  # noqa: E741 (the softmax's denominator)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_ok = pos < end
        slots = tl.load(table_ptr + row * stride_table + pos, mask=pos_ok, other=0).to(tl.int64)
        k = tl.load(
            k_ptr + slots[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
            mask=pos_ok[:, None],
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k)) * scale_log2  # [BLOCK_G, BLOCK_N], in log2 units
        s = tl.where(pos_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)  # noqa: E741
        v = tl.load(
            v_ptr + slots[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
            mask=pos_ok[:, None],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
    if SPLITS == 1:
        tl.store(out, (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
    else:
        # NOTE: a stretch past the request's end (a short request) leaves lse -inf and o 0; the
        # atomic's acq_rel makes every stretch's part visible to the program that counts last
        group = b * num_kv_heads + kv_head
        part = (group * SPLITS + split) * BLOCK_G + g
        empty = l == 0.0
        lse = tl.where(empty, float("-inf"), m + tl.log2(tl.where(empty, 1.0, l)))
        o = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l)[:, None])
        tl.store(part_o_ptr + part[:, None] * HEAD_DIM + d[None, :], o)
        tl.store(part_lse_ptr + part, lse)
        if tl.atomic_add(count_ptr + group, 1) == SPLITS - 1:
            top = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
            for i in range(SPLITS):
                top = tl.maximum(top, tl.load(part_lse_ptr + (group * SPLITS + i) * BLOCK_G + g))
            total = tl.zeros((BLOCK_G,), dtype=tl.float32)
            merged = tl.zeros((BLOCK_G, HEAD_DIM), dtype=tl.float32)
            for i in range(SPLITS):
                first = (group * SPLITS + i) * BLOCK_G + g
                weight = tl.exp2(tl.load(part_lse_ptr + first) - top)
                total += weight
                merged += weight[:, None] * tl.load(
                    part_o_ptr + first[:, None] * HEAD_DIM + d[None, :]
                )
            merged = merged / total[:, None]
            tl.store(out, merged.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
            tl.atomic_xchg(count_ptr + group, 0)  # (ready for the next launch)


def splits_for(batch: int, kv_heads: int, programs: int) -> int:
    """Stretches of each request's KV: enough that the launch has about `programs` programs (two
    a streaming multiprocessor); 1 where the requests and heads alone make that many."""
    return max(1, min(programs // (batch * kv_heads), MAX_SPLITS))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    splits: int | None = None,
    block_n: int = BLOCK_N,
    num_warps: int = 4,
    num_stages: int | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Attention of one new token a request: `q` [batch, heads, head_dim] against the first
    `kv_lens[i]` tokens of request `i`, whose KV slots are `page_table[rows[i], :kv_lens[i]]`
    in `k_cache` / `v_cache` [slots, kv_heads, head_dim]. `splits`: stretches of each request's
    KV (None: `splits_for`'s choice for this GPU; 1 on a CPU); `block_n`, `num_warps` and
    `num_stages` (None: Triton's default): the tile and its pipelining (benchmarks try others);
    `pdl`: programmatic dependent launch (`kernels/pdl.py`).
    Returns [batch, heads, head_dim]."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    if heads % kv_heads:
        raise ValueError(f"decode_attention: {heads} query heads over {kv_heads} KV heads")
    if splits is not None and not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"decode_attention: splits must be 1 to {MAX_SPLITS}, got {splits}")
    if splits is None:
        sms = q.device.type == "cuda" and torch.cuda.get_device_properties(q.device)
        splits = splits_for(batch, kv_heads, 2 * sms.multi_processor_count) if sms else 1
    if q.stride(-1) != 1:
        q = q.contiguous()
    pdl = check_pdl(q.device, pdl)
    group = heads // kv_heads
    block_g = max(16, triton.next_power_of_2(group))  # (a tensor-core tile has 16 rows)
    out = torch.empty_like(q)
    part_o = part_lse = counts = out  # (not read with one split)
    if splits > 1:
        what = f"decode_attention of {batch} requests x {kv_heads} KV heads"
        counts = split_counters(q.device, batch * kv_heads, what)
        parts = batch * kv_heads * splits * block_g
        part_o = torch.empty(parts * dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(parts, dtype=torch.float32, device=q.device)
    _decode_attention[(batch, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        page_table,
        rows,
        kv_lens,
        out,
        part_o,
        part_lse,
        counts,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        page_table.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        HEAD_DIM=dim,
        SPLITS=splits,
        BLOCK_G=block_g,
        BLOCK_N=block_n,
        PDL=pdl,
        num_warps=num_warps,
        **({} if num_stages is None else {"num_stages": num_stages}),
        **launch_options(pdl),
    )
    return out

"""A linear layer at decode batch sizes: ``y = x @ W.T (+ b)`` for a few rows of `x` (at most
`MAX_ROWS`), one Triton launch.

Why not cuBLAS: at 8 rows a decode step's GEMMs read their weights and do almost no math, so
they are bound by how fast the weights stream in. cuBLAS tiles a step of dummy Qwen3-0.6B with
64 output columns a program (on an H100: 83 launches a step of one 64x8 tile), which leaves a
1,024-column projection 16 programs on a GPU of 132 SMs. Here each program owns `BLOCK_N`
columns (16: the smallest tensor-core tile) and streams their whole rows of `W`, so the same
projection gets 64 programs and a 6,144-column one 384. No split over K: every output is summed
in one program in one order, so the same inputs give the same bits.

Measured (H100, 2026-12-05, dummy Qwen3-0.6B's shapes at 8 rows, each replayed in a CUDA graph):
it does not beat cuBLAS as it is, so `small_gemm` stays off. Fused QKV 4.68 us against cuBLAS's
3.63, output 5.39 against 4.84, gate-up 6.07 against 4.39, down 7.02 against 5.89 (their weights
alone take 1.3-3.8 us at the H100's bandwidth); the best other tiles tried (BLOCK_K 512 or 128,
two warps) came to 5.56 against 5.89 (down) and 4.67 against 4.39 (gate-up). The 1,024-column
projections are 3-4x their bound under both: what is left to try is a split over K."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  # rows of one tensor-core tile: a decode batch up to this size
BLOCK_K = 256  # weight columns a program loads per iteration (512 bytes of each row in bf16)


@triton.jit
def _small_gemm(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + k[None, :],
            mask=row_ok[:, None] & (k[None, :] < K),
            other=0.0,
        )
        w = tl.load(  # [BLOCK_K, BLOCK_N]: W's rows `cols`, read along K
            w_ptr + cols[None, :] * stride_wn + k[:, None],
            mask=col_ok[None, :] & (k[:, None] < K),
            other=0.0,
        )
        acc = tl.dot(x, w, acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = y_ptr + rows[:, None] * stride_ym + cols[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def block_n(n: int) -> int:
    """Output columns a program owns: 16 (the most programs) unless that makes more programs than
    a few waves of a large GPU need, where wider tiles reuse each loaded row of `x` more."""
    return 16 if n <= 8192 else 64


def small_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """`F.linear(x, weight, bias)` for `x` of at most `MAX_ROWS` rows (any leading shape)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    m, k = x2.shape
    n = weight.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"small_linear takes at most {MAX_ROWS} rows, got x of shape {shape}")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        raise ValueError("small_linear needs a weight contiguous along its input features")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bn = block_n(n)
    _small_gemm[(triton.cdiv(n, bn),)](
        x2,
        weight,
        bias if bias is not None else weight,  # (not read without a bias)
        y,
        m,
        n,
        k,
        x2.stride(0),
        weight.stride(0),
        y.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=MAX_ROWS,
        BLOCK_N=bn,
        BLOCK_K=BLOCK_K,
        num_warps=4,
        num_stages=4,
    )
    return y.view(*shape[:-1], n)

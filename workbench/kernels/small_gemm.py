"""A linear layer at decode batch sizes: ``y = x @ W.T (+ b)`` for a few rows of `x` (at most
`MAX_ROWS`), one Triton launch.

Why not cuBLAS: at 8 rows a decode step's GEMMs read their weights and do almost no math, so
they are bound by how fast the weights stream in. cuBLAS tiles a step of dummy Qwen3-0.6B with
64 output columns a program (on an H100: 83 launches a step of one 64x8 tile), which leaves a
1,024-column projection 16 programs on a GPU of 132 SMs. Here each program owns `BLOCK_N`
columns (16: the smallest tensor-core tile) and streams their whole rows of `W`, so the same
projection gets 64 programs and a 6,144-column one 384.

Measured (H100, 2026-12-05, dummy Qwen3-0.6B's shapes at 8 rows, each replayed in a CUDA graph):
it does not beat cuBLAS as it is, so `small_gemm` stays off. Fused QKV 4.68 us against cuBLAS's
3.63, output 5.39 against 4.84, gate-up 6.07 against 4.39, down 7.02 against 5.89 (their weights
alone take 1.3-3.8 us at the H100's bandwidth); the best other tiles tried (BLOCK_K 512 or 128,
two warps) came to 5.56 against 5.89 (down) and 4.67 against 4.39 (gate-up). The 1,024-column
projections are 3-4x their bound under both: 64 programs of 16 columns leave most of the GPU's
SMs idle. So K is split too (`split_k`: about two programs an SM; 1,024 x 2,048 at 8 rows in 4
splits, 256 programs), each split's sum left in a slab of float32 and the slabs added in split
order by whichever program of a column block counts last: one launch, and still one order of
sums, so the same bits. `gated` reads a gated MLP's gate | up and computes silu(gate) * up as
it loads them, in place of a SiLU-and-mul launch before the down projection (measured slower
below, so not used by the MLP). With `pdl` it launches with programmatic dependent launch and
reads its first tile of weights before it waits for the kernel before it (`kernels/pdl.py`).

Measured again (H100, 2026-12-06, `benchmarks/decode_gemms.py --batch 8`): split, the step's
GEMMs take 705 us against cuBLAS's 640 (bound 359): QKV 4.5 us against 3.6, output 5.3 against
5.0, gate-up 5.9 against 4.2, down 5.6 against 5.9 (the only win); with `pdl` 744 (no gain where
each call of a graph is the same GEMM). `gated` took 17.0 us against 7.2 for FlashInfer's
SiLU-and-mul and cuBLAS, so the MLP does not use it; the benchmark still times it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import check_pdl, launch_options, wait_for_previous
from .split_counters import split_counters

MAX_ROWS = 16  # rows of one tensor-core tile: a decode batch up to this size
BLOCK_K = 256  # weight columns a program loads per iteration (512 bytes of each row in bf16)


@triton.jit
def _x_tile(x_ptr, rows, k, k_end, row_ok, stride_xm, K, dtype, GATED: tl.constexpr):
    """[BLOCK_M, BLOCK_K] of the input at columns `k` (silu(gate) * up when `GATED`)."""
    x_at = x_ptr + rows[:, None] * stride_xm + k[None, :]
    x_ok = row_ok[:, None] & (k[None, :] < k_end)
    x = tl.load(x_at, mask=x_ok, other=0.0)
    if GATED:  # x is gate | up: the input is silu(gate) * up, rounded as a kernel writes it
        up = tl.load(x_at + K, mask=x_ok, other=0.0).to(tl.float32)
        gate = x.to(tl.float32)
        x = (gate * tl.sigmoid(gate) * up).to(dtype)
    return x


@triton.jit
def _w_tile(w_ptr, cols, k, k_end, col_ok, stride_wn):
    """[BLOCK_K, BLOCK_N]: W's rows `cols`, read along K at columns `k`."""
    return tl.load(
        w_ptr + cols[None, :] * stride_wn + k[:, None],
        mask=col_ok[None, :] & (k[:, None] < k_end),
        other=0.0,
    )


@triton.jit
def _small_gemm(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    partial_ptr,
    count_ptr,
    M,
    N,
    K,
    K_PER_SPLIT,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < N
    tile = rows[:, None] * N + cols[None, :]  # (a partial sum's place in its split's slab)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.minimum(K, (pid_k + 1) * K_PER_SPLIT)
    k_first = pid_k * K_PER_SPLIT
    dtype = w_ptr.dtype.element_ty
    if PREFETCH:  # (kernels/pdl.py) no kernel writes W: its first tile is read before the wait
        w = _w_tile(w_ptr, cols, k_first + ks, k_end, col_ok, stride_wn)
    wait_for_previous(PDL)
    if PREFETCH:
        x = _x_tile(x_ptr, rows, k_first + ks, k_end, row_ok, stride_xm, K, dtype, GATED)
        acc = tl.dot(x, w, acc)
        k_first += BLOCK_K
    for k0 in range(k_first, k_end, BLOCK_K):
        x = _x_tile(x_ptr, rows, k0 + ks, k_end, row_ok, stride_xm, K, dtype, GATED)
        acc = tl.dot(x, _w_tile(w_ptr, cols, k0 + ks, k_end, col_ok, stride_wn), acc)
    last = True
    if SPLIT_K > 1:
        # NOTE: each split leaves its sum in its slab; the program that counts last (the
        # atomic's acq_rel makes the others' slabs visible to it) adds the slabs in split order,
        # so the bits do not depend on which split finished last
        tl.store(partial_ptr + pid_k * BLOCK_M * N + tile, acc, mask=col_ok[None, :])
        last = tl.atomic_add(count_ptr + pid_n, 1) == SPLIT_K - 1
    if last:
        if SPLIT_K > 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for split in range(SPLIT_K):
                acc += tl.load(partial_ptr + split * BLOCK_M * N + tile, mask=col_ok[None, :])
            tl.atomic_xchg(count_ptr + pid_n, 0)  # (ready for the next launch)
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        out = y_ptr + rows[:, None] * stride_ym + cols[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def block_n(n: int) -> int:
    """Output columns a program owns: 16 (the most programs) unless that makes more programs than
    a few waves of a large GPU need, where wider tiles reuse each loaded row of `x` more."""
    return 16 if n <= 8192 else 64


def split_k(n: int, k: int, programs: int) -> int:
    """Splits of K for `n` output columns: enough that the launch has about `programs` programs
    (two a streaming multiprocessor), each split at least two `BLOCK_K` steps; 1 (no split)
    where the columns alone make that many."""
    columns = triton.cdiv(n, block_n(n))
    return max(1, min(programs // columns, k // (2 * BLOCK_K), MAX_SPLITS))


MAX_SPLITS = 16


def small_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    splits: int | None = None,
    gated: bool = False,
    pdl: bool = False,
):
    """`F.linear(x, weight, bias)` for `x` of at most `MAX_ROWS` rows (any leading shape). K is
    split `splits` ways (None: `split_k`'s choice for this GPU; 1 on a CPU). `gated`: `x` is a
    gated MLP's gate | up (twice the weight's inputs) and the input is silu(gate) * up, computed
    as it is read: no SiLU-and-mul launch, no intermediate written. `pdl`: launch with
    programmatic dependent launch (`kernels/pdl.py`)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    m, k = x2.shape
    n = weight.shape[0]
    if gated:
        if k != 2 * weight.shape[1]:
            raise ValueError(
                f"small_linear(gated=True) takes gate | up of 2 x {weight.shape[1]} features, "
                f"got x of shape {tuple(shape)}"
            )
        k //= 2
    if m > MAX_ROWS:
        raise ValueError(f"small_linear takes at most {MAX_ROWS} rows, got x of shape {shape}")
    if splits is not None and not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"small_linear: splits must be 1 to {MAX_SPLITS}, got {splits}")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        raise ValueError("small_linear needs a weight contiguous along its input features")
    wait = check_pdl(x.device, pdl)  # (False in Triton's interpreter, which still prefetches)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bn = block_n(n)
    if splits is None:
        sms = x.device.type == "cuda" and torch.cuda.get_device_properties(x.device)
        splits = split_k(n, k, 2 * sms.multi_processor_count) if sms else 1
    per_split = triton.cdiv(triton.cdiv(k, splits), BLOCK_K) * BLOCK_K
    splits = triton.cdiv(k, per_split)  # (none of them empty)
    partial = counts = y  # (not read without a split)
    if splits > 1:
        what = f"small_linear of {n} columns"
        counts = split_counters(x.device, triton.cdiv(n, bn), what)
        partial = torch.empty((splits, MAX_ROWS, n), dtype=torch.float32, device=x.device)
    _small_gemm[(triton.cdiv(n, bn), splits)](
        x2,
        weight,
        bias if bias is not None else weight,  # (not read without a bias)
        y,
        partial,
        counts,
        m,
        n,
        k,
        per_split,
        x2.stride(0),
        weight.stride(0),
        y.stride(0),
        HAS_BIAS=bias is not None,
        GATED=gated,
        SPLIT_K=splits,
        BLOCK_M=MAX_ROWS,
        BLOCK_N=bn,
        BLOCK_K=BLOCK_K,
        PREFETCH=bool(pdl),
        PDL=wait,
        num_warps=4,
        num_stages=4,
        **launch_options(wait),
    )
    return y.view(*shape[:-1], n)

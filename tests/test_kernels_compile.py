"""Every Triton kernel of `workbench/kernels/` compiles for a Hopper GPU (sm_90) on this machine,
with no GPU: Triton's compiler and its bundled `ptxas`, ahead of time. A kernel edited where no GPU
is lent fails here, not in a GPU call's minutes. Each is compiled as its wrapper launches it (the
argument types and the constexprs the wrapper passes, for Qwen3-0.6B's and Qwen3-30B-A3B's shapes,
bfloat16); the registers and spills `cuobjdump` reports are printed (`-s`), not asserted."""

from __future__ import annotations

import os
import subprocess

import pytest

triton = pytest.importorskip("triton", reason="the kernels need triton (pip install triton)")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from workbench.kernels import (  # noqa: E402
    decode_attention,
    fused_moe,
    moe_route,
    page_indices,
    qk_norm_rope,
    sampling,
    small_gemm,
)

HOPPER = GPUTarget("cuda", 90, 32)
_TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def _args(**types):
    """A signature: each argument's Triton type, in the kernel's order."""
    return types


SMALL_GEMM_ARGS = _args(
    x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", partial_ptr="*fp32",
    count_ptr="*i32", M="i32", N="i32", K="i32", K_PER_SPLIT="i32", stride_xm="i32",
    stride_wn="i32", stride_ym="i32",
)  # fmt: skip
# name -> (kernel, signature, constexprs, launch options), as the wrappers launch them
KERNELS = {
    "moe_route_topk": (
        moe_route.moe_route_topk,
        _args(
            logits="*bf16", logits_stride="i32", topk_weights="*bf16", topk_ids="*i64",
            program_counts="*i32", routing="*i32", counted="*i32", sorted_pairs="*i32",
            tokens="i32", num_experts="i32", tiles_per_program="i32", capacity="i32",
            fill_rows="i32",
        ),
        dict(
            TOP_K=8, RENORMALIZE=True, COUNT=True, WEIGHED=True, TILE=moe_route.TILE_TOKENS,
            E_PAD=128, K_PAD=8, FILL_CHUNK=moe_route._FILL_CHUNK,
        ),
        dict(num_warps=4),
    ),
    "moe_route_align": (
        moe_route.moe_route_align,
        _args(
            topk_ids="*i64", program_counts="*i32", sorted_pairs="*i32", block_experts="*i32",
            tokens="i32", num_experts="i32", tiles_per_program="i32", num_programs="i32",
            num_blocks="i32", block_rows="i32",
        ),
        dict(
            TOP_K=8, BLOCK_M=fused_moe.DECODE.block_m, TILE=moe_route.TILE_TOKENS,
            TILE_PAIRS=triton.next_power_of_2(moe_route.TILE_TOKENS * 8), E_PAD=128,
            P_PAD=triton.next_power_of_2(moe_route.MAX_PROGRAMS),
            BLOCK_CHUNK=moe_route._BLOCK_CHUNK,
        ),
        dict(num_warps=4),
    ),
    **{
        f"moe_gate_up_silu-{name}": (
            fused_moe.moe_gate_up_silu,
            _args(
                x="*bf16", x_stride="i32", w13="*bf16", w13_expert_stride="i32",
                w13_row_stride="i32", sorted_pairs="*i32", block_experts="*i32", act="*bf16",
                top_k="i32", pair_count="i32", hidden="i32", inter="i32",
            ),
            dict(
                BLOCK_M=blocks.block_m, BLOCK_N=blocks.block_n, BLOCK_K=blocks.block_k,
                PRECISION="tf32",
            ),
            dict(num_warps=blocks.num_warps, num_stages=blocks.num_stages),
        )
        for name, blocks in (("decode", fused_moe.DECODE), ("prefill", fused_moe.PREFILL))
    },
    "moe_down_weighted": (
        fused_moe.moe_down_weighted,
        _args(
            act="*bf16", w2="*bf16", w2_expert_stride="i32", w2_row_stride="i32",
            sorted_pairs="*i32", block_experts="*i32", topk_weights="*bf16", out="*bf16",
            pair_count="i32", hidden="i32", inter="i32",
        ),
        dict(
            BLOCK_M=fused_moe.DECODE.block_m, BLOCK_N=fused_moe.DECODE.block_n,
            BLOCK_K=fused_moe.DECODE.block_k, PRECISION="tf32",
        ),
        dict(num_warps=fused_moe.DECODE.num_warps, num_stages=fused_moe.DECODE.num_stages),
    ),
    "gather_pages": (
        page_indices._gather_pages,
        _args(page_table="*i32", table_stride="i32", rows="*i32", indptr="*i32", indices="*i32"),
        dict(PAGE_SIZE=16, BLOCK=page_indices.BLOCK),
        dict(),
    ),
    "qk_norm_rope_store": (
        qk_norm_rope._qk_norm_rope_store,
        _args(
            qkv="*bf16", qkv_stride="i32", positions="*i64", cos_table="*fp32",
            sin_table="*fp32", table_stride="i32", q_weight="*bf16", k_weight="*bf16",
            eps="fp32", out_loc="*i64", k_cache="*bf16", v_cache="*bf16", q_out="*bf16",
            num_heads="i32", num_kv_heads="i32",
        ),
        dict(HEADS=16, KV_HEADS=8, HALF=64, NORM=True, PDL=False),
        dict(),
    ),
    "race_segments": (
        sampling.race_segments,
        _args(
            logits="*bf16", row_stride="i32", temperatures="*fp32", keys="*i64",
            best_value="*fp32", best_index="*i32", vocab="i32", num_segments="i32",
        ),
        dict(SEGMENT=sampling.SEGMENT, BLOCK=sampling.BLOCK),
        dict(num_warps=sampling.NUM_WARPS),
    ),
    "small_gemm": (
        small_gemm._small_gemm,
        SMALL_GEMM_ARGS,
        dict(
            HAS_BIAS=False, GATED=False, SPLIT_K=1, BLOCK_M=small_gemm.MAX_ROWS,
            BLOCK_N=small_gemm.block_n(4096), BLOCK_K=small_gemm.BLOCK_K, PREFETCH=False, PDL=False,
        ),
        dict(num_warps=4, num_stages=4),
    ),
    "small_gemm gated split 4": (
        small_gemm._small_gemm,
        SMALL_GEMM_ARGS,
        dict(
            HAS_BIAS=True, GATED=True, SPLIT_K=4, BLOCK_M=small_gemm.MAX_ROWS,
            BLOCK_N=small_gemm.block_n(1024), BLOCK_K=small_gemm.BLOCK_K, PREFETCH=False, PDL=False,
        ),
        dict(num_warps=4, num_stages=4),
    ),
    "decode_attention split 4": (
        decode_attention._decode_attention,
        _args(
            q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", table_ptr="*i32", rows_ptr="*i32",
            lens_ptr="*i32", out_ptr="*bf16", part_o_ptr="*fp32", part_lse_ptr="*fp32",
            count_ptr="*i32", scale_log2="fp32", stride_qb="i32", stride_qh="i32",
            stride_ks="i32", stride_kh="i32", stride_vs="i32", stride_vh="i32",
            stride_table="i32", stride_ob="i32", stride_oh="i32",
        ),
        dict(
            GROUP=2, HEAD_DIM=128, SPLITS=4, BLOCK_G=16, BLOCK_N=decode_attention.BLOCK_N,
            PDL=False,
        ),
        dict(num_warps=4),
    ),
}  # fmt: skip
# the kernels that take PDL (kernels/pdl.py), each as the engine launches it with `pdl=True`
PDL_KERNELS = ("qk_norm_rope_store", "small_gemm", "small_gemm gated split 4",
               "decode_attention split 4")  # fmt: skip
for _name in PDL_KERNELS:
    _kernel, _types, _constexprs, _options = KERNELS[_name]
    _with = {k: True for k in ("PREFETCH", "PDL") if k in _constexprs}  # (as pdl=True sets them)
    KERNELS[f"{_name} pdl"] = (
        _kernel, _types, {**_constexprs, **_with}, {**_options, "launch_pdl": True}
    )  # fmt: skip


def _resources(cubin: bytes, tmp_path) -> str:
    """`cuobjdump`'s line of registers, stack, shared and local memory, or why there is none."""
    path = tmp_path / "kernel.cubin"
    path.write_bytes(cubin)
    try:
        done = subprocess.run(
            [os.path.join(_TOOLS, "cuobjdump"), "--dump-resource-usage", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError as error:
        return f"(no cuobjdump: {error})"
    lines = [line.strip() for line in done.stdout.splitlines() if "REG:" in line]
    return lines[0] if lines else "(cuobjdump printed no resources)"


@pytest.mark.parametrize("name", KERNELS)
def test_the_kernel_compiles_for_hopper(name, tmp_path):
    if not os.access(os.path.join(_TOOLS, "ptxas"), os.X_OK):
        pytest.skip("this Triton has no bundled ptxas")
    kernel, types, constexprs, options = KERNELS[name]
    assert list(types) + list(constexprs) == list(kernel.arg_names), "the kernel's arguments"
    signature = {**types, **dict.fromkeys(constexprs, "constexpr")}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=HOPPER, options=options)
    cubin, ptx = compiled.asm["cubin"], compiled.asm["ptx"]
    assert cubin and ".target sm_90" in ptx
    # PDL's wait and trigger are in the kernel exactly when it is launched with PDL
    pdl = constexprs.get("PDL", False)
    assert ("griddepcontrol.wait" in ptx) == pdl
    assert ("griddepcontrol.launch_dependents" in ptx) == pdl
    assert compiled.metadata.launch_pdl == options.get("launch_pdl", False)
    print(f"{name}: {_resources(cubin, tmp_path)}")

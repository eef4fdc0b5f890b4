"""An MoE layer's routing and experts alone, by the experts' tile choice, against reading what
the layer touches.

    python benchmarks/moe_tiles.py [--model dummy:qwen3-30b-a3b] [--batch 8 64 256]
                                   [--tiles default k64-w8 ...]

One `SparseMoE` layer of the model's shapes (bfloat16, seeded random weights, random tokens). Per
batch size: the device time (replayed in a CUDA graph, as the engine's decode steps are) of its
routing both ways, each with the router's GEMM: the Triton backend's (`kernels/moe_route.py`) and
the torch backend's (`SparseMoE.route`, then `align_to_blocks`); then per tile choice
(`fused_moe.MoeBlocks`; "default" is `choose_blocks`'), the fused experts' time, the bytes they
must read (each expert some token picked: its gate/up and down weights; the activations in and out)
over that time, the bound at the GPU's bandwidth (`history/roofline.py`'s spec) and the ratio, and
the largest difference of its output from the default's (tilings sum in other orders). Why:
compiled for sm_90 by the GPU's Triton (3.6), the decode tiles (BLOCK_K 128, 4 warps) keep 32
registers and spill 2.8 KB a thread to the stack, where BLOCK_K 64 at 8 warps spills nothing
(`tests/test_kernels_compile.py` prints each kernel's); whether that costs time only a GPU says.
Needs a GPU.
"""

from __future__ import annotations

import argparse
import sys

import torch
from fused_ops import graph_time

from workbench.history.roofline import roofline_spec
from workbench.layers.moe import SparseMoE
from workbench.models import ModelConfig, resolve

TILES = {  # name -> (block_m, block_n, block_k, num_warps, num_stages); None: choose_blocks'
    "default": None,
    "k64-w4": (16, 64, 64, 4, 3),
    "k64-w8": (16, 64, 64, 8, 3),
    "k128-w8": (16, 64, 128, 8, 3),
    "n128-k64-w8": (16, 128, 64, 8, 3),
    "m32-k64-w8": (32, 64, 64, 8, 3),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="dummy:qwen3-30b-a3b")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--tiles", nargs="+", default=list(TILES), choices=list(TILES))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("moe_tiles.py times Triton kernels on a GPU; this machine has none")
    cfg = ModelConfig.from_dir(resolve(args.model))
    if not cfg.num_experts:
        sys.exit(f"{args.model} has no experts")
    spec = roofline_spec(torch.device("cuda"))
    experts, top_k = cfg.num_experts, cfg.num_experts_per_tok
    hidden, inter = cfg.hidden_size, cfg.moe_intermediate_size
    gen = torch.Generator("cuda").manual_seed(0)
    layer = SparseMoE(0, hidden, experts, top_k, inter, renormalize=cfg.norm_topk_prob)
    layer = layer.to(device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    layer.w13.normal_(0.0, 0.02, generator=gen)
    layer.w2.normal_(0.0, 0.02, generator=gen)
    layer.gate.weight.normal_(0.0, 0.5, generator=gen)  # random logits of some spread
    bound = f"bound at {spec.bandwidth / 1e12:.1f} TB/s" if spec else "no bound (no known spec)"
    print(
        f"{args.model}: one MoE layer, {experts} experts of {inter} x {hidden}, top-{top_k}, "
        f"bfloat16, on {torch.cuda.get_device_name()}; {bound}"
    )
    for batch in args.batch:
        one_batch(batch, layer, spec, args.tiles, gen)


def one_batch(batch, layer, spec, tiles, gen) -> None:
    """Routing and the experts at `batch` tokens: one line, then a line per tile choice."""
    from workbench.kernels.fused_moe import MoeBlocks, align_to_blocks, choose_blocks, fused_moe
    from workbench.kernels.moe_route import route_and_align

    experts, top_k, renorm = layer.num_experts, layer.top_k, layer.renormalize
    w13, w2 = layer.w13, layer.w2
    hidden, inter = w2.shape[1], w2.shape[2]
    x = torch.randn(batch, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    logits = layer.gate(x)
    default = choose_blocks(batch * top_k, experts)
    weights, ids, *aligned = route_and_align(logits, top_k, renorm, x.dtype, default.block_m)
    touched = int(ids.unique().numel())
    nbytes = touched * 3 * inter * hidden * 2 + 2 * batch * hidden * 2
    bound_us = nbytes / spec.bandwidth * 1e6 if spec else float("nan")

    def torch_routing():  # SparseMoE's torch path: route, then the sort into blocks
        align_to_blocks(layer.route(x)[1], experts, default.block_m)

    def our_routing():  # SparseMoE's Triton path
        route_and_align(layer.gate(x), top_k, renorm, x.dtype, default.block_m)

    ours, theirs = graph_time(our_routing), graph_time(torch_routing)
    print(
        f"batch {batch}: {touched} experts touched, {nbytes / 1e6:.1f} MB to read, bound "
        f"{bound_us:.1f} us; routing with its gate {ours * 1e6:.1f} us (torch's "
        f"{theirs * 1e6:.1f} us)"
    )
    reference = fused_moe(x, w13, w2, weights, ids, blocks=default, aligned=tuple(aligned))
    for name in tiles:
        blocks = default if TILES[name] is None else MoeBlocks(*TILES[name])
        _, _, *mine = route_and_align(logits, top_k, renorm, x.dtype, blocks.block_m)

        def experts_call(blocks=blocks, mine=tuple(mine)):
            return fused_moe(x, w13, w2, weights, ids, blocks=blocks, aligned=mine)

        try:
            us = graph_time(experts_call) * 1e6
        except Exception as error:  # a tile the compiler or the GPU refuses
            print(f"  {name:<12} {tuple(blocks)}: failed: {str(error).splitlines()[0][:120]}")
            continue
        diff = (experts_call().float() - reference.float()).abs().max().item()
        print(
            f"  {name:<12} {tuple(blocks)}: {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s  "
            f"x bound {us / bound_us:5.2f}  max |diff| vs default {diff:.2e}"
        )


if __name__ == "__main__":
    main()

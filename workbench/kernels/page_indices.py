"""Each request's KV page ids, gathered from the page table into one flat list (FlashInfer's
`indices`). A fixed grid reading `rows` and `indptr` on the device, so a CUDA graph captures it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # pages per iteration of a program's loop


@triton.jit
def _gather_pages(
    page_table,
    table_stride,
    rows,
    indptr,
    indices,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(rows + i).to(tl.int64)
    start = tl.load(indptr + i)
    count = tl.load(indptr + i + 1) - start
    table_row = page_table + row * table_stride
    for first in range(0, count, BLOCK):
        page = first + tl.arange(0, BLOCK)
        inside = page < count
        slot = tl.load(table_row + page.to(tl.int64) * PAGE_SIZE, mask=inside, other=0)
        tl.store(indices + start + page, slot // PAGE_SIZE, mask=inside)


def page_indices(
    page_table: torch.Tensor,
    rows: torch.Tensor,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    page_size: int,
) -> torch.Tensor:
    """Write the pages of the requests in `rows` into `indices` at `indptr`: request ``i``'s
    ``indptr[i + 1] - indptr[i]`` first pages. All on the device; returns `indices`."""
    if len(rows):
        _gather_pages[(len(rows),)](
            page_table, page_table.stride(0), rows, indptr, indices, page_size, BLOCK
        )
    return indices


def page_indices_reference(
    page_table: torch.Tensor, rows: torch.Tensor, indptr: torch.Tensor, page_size: int
) -> torch.Tensor:
    """The same gather in torch operations."""
    counts = indptr[1:] - indptr[:-1]
    total = int(indptr[-1])
    owner = torch.repeat_interleave(torch.arange(len(rows), device=rows.device), counts)
    first_pos = (torch.arange(total, device=rows.device) - indptr[:-1][owner]) * page_size
    return page_table[rows[owner], first_pos] // page_size

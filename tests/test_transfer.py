"""Host-to-device staging: several index arrays travel as one copy and come back intact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.device import to_device_many


def test_packed_arrays_come_back_as_aligned_int64_slices():
    arrays = [np.arange(5), [7, 8, 9], np.zeros(0, np.int64), np.array([2**31 - 1], np.int32)]
    out = to_device_many(arrays, torch.device("cpu"))
    assert [t.tolist() for t in out] == [list(np.asarray(a)) for a in arrays]
    assert all(t.dtype == torch.int64 and t.is_contiguous() for t in out)
    base = out[0].data_ptr()
    assert all((t.data_ptr() - base) % 16 == 0 for t in out)
    # slices of one buffer must not overlap: writing one leaves the others as they were
    out[0].fill_(-1)
    assert out[1].tolist() == [7, 8, 9] and out[3].tolist() == [2**31 - 1]


def test_ranges_match_the_per_request_aranges():
    from workbench.engine.inputs import ranges

    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 256):
        starts = rng.integers(0, 1000, n)
        ends = starts + rng.integers(0, 5, n)  # empty ranges included
        expected = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends)] + [[]])
        assert ranges(starts, ends).tolist() == expected.astype(np.int64).tolist()


gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@gpu
@needs_cuda
def test_the_staging_ring_keeps_every_array_through_many_cycles():
    """Arrays of every dtype sent while the device lags far behind, through the ring's segments
    many times over (small ones, ones that fill a segment, ones too large for it): what the
    device reads right after each send (here, a copy of it, as a kernel would) is what was
    sent, although the host has long written over the memory it came from. The same for host
    views copied by someone else. A sent array is the caller's until the next sends reuse its
    device memory: reading it then is not promised."""
    from workbench.device import Staging

    device = torch.device("cuda")
    ring = Staging(device, segment_bytes=4096, segments=3)
    rng = np.random.default_rng(0)
    read = []
    for i in range(400):
        n = int(rng.choice([1, 7, 300, 1000, 3000]))  # 3000 int64: larger than a segment
        arrays = [
            rng.integers(-(2**40), 2**40, n),
            rng.integers(0, 2**31 - 1, n).astype(np.int32),
            rng.random(n).astype(np.float32),
        ][: 1 + i % 3]
        read += [(a, t.clone()) for a, t in zip(arrays, ring.send(arrays))]
        (view,) = ring.host([arrays[0]])
        target = torch.empty(len(arrays[0]), dtype=torch.int64, device=device)
        target.copy_(view, non_blocking=True)
        read.append((arrays[0], target))
        if i % 50 == 0:
            torch.cuda._sleep(10_000_000)  # the device falls behind the host for a while
    torch.cuda.synchronize()
    for a, t in read:
        assert t.device.type == "cuda" and t.dtype == torch.from_numpy(a).dtype
        assert np.array_equal(t.cpu().numpy(), a)


@gpu
@needs_cuda
@pytest.mark.parametrize("page_size", [1, 16])
def test_the_page_index_kernel_gathers_what_torch_does(page_size):
    from workbench.kernels.page_indices import page_indices, page_indices_reference

    g = torch.Generator(device="cuda").manual_seed(page_size)
    table = torch.randint(0, 2**30, (33, 5000), dtype=torch.int32, device="cuda", generator=g)
    table = table // page_size * page_size
    rows = torch.tensor([4, 0, 32, 9, 4, 17], dtype=torch.int64, device="cuda")
    lens = np.array([1, 4999, 16, 2049, 700, 33])
    pages = -(-lens // page_size)
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32).cuda()
    out = torch.full((int(pages.sum()) + 9,), -5, dtype=torch.int32, device="cuda")
    page_indices(table, rows, indptr, out, page_size)
    want = page_indices_reference(table, rows, indptr.long(), page_size)
    assert torch.equal(out[: len(want)], want.to(torch.int32))
    assert (out[len(want) :] == -5).all()  # nothing written past the last request's pages


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_lengths_follow_their_definition(page_size):
    """FlashInfer's page list of a batch: request i's pages start at indptr[i], it has
    ceil(kv_len / page_size) of them, and its last holds the rest of its tokens."""
    from workbench.attention.base import paged_lens

    kv_lens = np.random.default_rng(page_size).integers(1, 100, 37).astype(np.int32)
    indptr, last = np.full(38, -1, np.int32), np.full(37, -1, np.int32)
    paged_lens(kv_lens, page_size, indptr, last)
    pages = [-(-n // page_size) for n in kv_lens.tolist()]
    assert indptr.tolist() == np.concatenate([[0], np.cumsum(pages)]).tolist()
    assert last.tolist() == [n - (p - 1) * page_size for n, p in zip(kv_lens.tolist(), pages)]
    assert (last >= 1).all() and (last <= page_size).all()


def test_the_graph_inputs_layout_keeps_fields_apart_and_aligned():
    """Every input of a padded shape (decode: as many tokens as rows) has its own 16-byte
    aligned bytes, the same on the host and the device side; what is written through one
    field's view is read back from it."""
    from workbench.engine.graph import Layout, graph_fields

    for tokens, rows in ((1, 1), (3, 3), (8, 8), (256, 256), (16, 8), (4096, 255)):
        layout = Layout(graph_fields(tokens, rows))
        spans = sorted((at, at + n * dt.itemsize, name) for name, dt, at, n in layout.fields)
        assert all(at % 16 == 0 for at, _, _ in spans)
        assert all(a_end <= b_at for (_, a_end, _), (b_at, _, _) in zip(spans, spans[1:]))
        assert spans[-1][1] <= layout.nbytes
        host = np.zeros(layout.nbytes, dtype=np.uint8)
        views = layout.views(host)
        for i, view in enumerate(views.values()):
            view[:] = i + 1
        device = layout.views(torch.from_numpy(host.copy()))
        lengths = dict(zip(views, (n for _, _, _, n in layout.fields)))
        for i, (name, view) in enumerate(views.items()):
            assert len(view) == lengths[name] in (tokens, rows, rows + 1)
            assert (view == i + 1).all() and (device[name].numpy() == i + 1).all()


def test_every_prompt_step_that_fits_finds_a_graph_that_pads_it_little():
    """Every batch of at most `cuda_graph_max_tokens` tokens and as many requests as fit them
    gets a captured shape: the smallest that holds it, at most twice its tokens up to 512 and
    half as many again above, and rows that hold its requests."""
    from workbench.engine.graph import graph_shapes, shape_for, token_sizes

    for max_tokens, max_rows in ((4096, 256), (300, 8), (16384, 64)):
        shapes = graph_shapes(max_tokens, max_rows, max_seq_len=8192)
        assert max(t for t, _ in shapes) == max_tokens == token_sizes(max_tokens)[-1]
        for tokens in range(1, max_tokens + 1, 7):
            for rows in {
                1,
                min(tokens, max_rows),
                min(tokens, 9, max_rows),
                min(tokens, 40, max_rows),
            }:
                shape = shape_for(shapes, tokens, rows)
                assert shape is not None and shape[0] >= tokens and shape[1] >= rows
                assert shape[0] <= max(16, 2 * tokens if tokens <= 512 else 1.5 * tokens)
                bigger = [s for s in shapes if s[0] >= tokens and s[1] >= rows]
                assert shape == min(bigger)
        assert shape_for(shapes, max_tokens + 1, 1) is None
    # a dummy request of the capture attends within the dummy row: no shape wider than it
    assert all(-(-t // r) <= 100 for t, r in graph_shapes(4096, 256, max_seq_len=100))

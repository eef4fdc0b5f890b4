"""Host-to-device staging: several index arrays travel as one copy and come back intact."""

from __future__ import annotations

import numpy as np
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

"""Device helpers: host-to-device copies that never stall the host, and a device timer.

A copy from pageable host memory makes CUDA wait for the stream to drain first, which would undo
overlap scheduling (the host would wait for the batch in flight). Everything the scheduler sends
per step goes through pinned memory instead: a ring of pinned staging memory per GPU (`Staging`),
allocated once and reused, with one copy per call. Allocating a pinned tensor per array (as a
first version did, about nine a decode step) cost the H200's host 15-20 us each.
"""

from __future__ import annotations

import time

import numpy as np
import torch

ALIGN = 16  # bytes: each staged array starts here, for kernels that load with vector width


class Staging:
    """Pinned host memory and device memory of the same layout, used in turn as a ring.

    Arrays are packed at the write head of the current segment (host side), copied to the same
    offsets on the device in one transfer, and handed out as device views. A segment is reused
    only after the copies out of it have run: leaving a segment records an event, and coming
    back to segment ``s`` waits for the event recorded on leaving ``s + 1``, which comes after
    every copy enqueued while ``s`` was current, including those of host views handed out
    from it (`host`), which their callers copy a little later. That event is a full cycle of
    segments old, so the wait is for work long done. On the device, stream order makes reuse
    safe: a new copy into a region is queued after the kernels that read its old contents.
    """

    def __init__(self, device: torch.device, segment_bytes: int = 1 << 20, segments: int = 8):
        self.device, self.segment_bytes, self.segments = device, segment_bytes, segments
        total = segment_bytes * segments
        self.host_bytes = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        self.host_np = self.host_bytes.numpy()
        self.device_bytes = torch.empty(total, dtype=torch.uint8, device=device)
        self.left: list[torch.cuda.Event | None] = [None] * segments  # recorded on leaving
        self.segment, self.head = 0, 0  # where the next array goes

    def _reserve(self, nbytes: int) -> int | None:
        """The offset of `nbytes` in the current segment (moving on when it is full); None
        when they would not fit in any."""
        if nbytes > self.segment_bytes:
            return None
        if self.head + nbytes > self.segment_bytes:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.left[self.segment] = event
            self.segment = (self.segment + 1) % self.segments
            self.head = 0
            after = self.left[(self.segment + 1) % self.segments]
            if after is not None:
                after.synchronize()
        offset = self.segment * self.segment_bytes + self.head
        self.head += -(-nbytes // ALIGN) * ALIGN
        return offset

    def _pack(self, arrays: list[np.ndarray]) -> tuple[int, list[int]] | None:
        """The arrays written one after the other into pinned memory: the first offset and
        each array's; None when they do not fit a segment."""
        sizes = [-(-a.nbytes // ALIGN) * ALIGN for a in arrays]
        start = self._reserve(max(1, sum(sizes)))
        if start is None:
            return None
        offsets, at = [], start
        for a, size in zip(arrays, sizes):
            self.host_np[at : at + a.nbytes].view(a.dtype)[:] = a.reshape(-1)
            offsets.append(at)
            at += size
        return start, offsets

    def send(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """Each array on the device (same dtype and length), all in one copy."""
        packed = self._pack(arrays)
        if packed is None:  # too large for the ring: a pinned tensor of its own each
            return [_pinned(a).to(self.device, non_blocking=True) for a in arrays]
        start, offsets = packed
        end = offsets[-1] + arrays[-1].nbytes if arrays else start
        self.device_bytes[start:end].copy_(self.host_bytes[start:end], non_blocking=True)
        return [_view(self.device_bytes, at, a) for at, a in zip(offsets, arrays)]

    def region(self, nbytes: int) -> tuple[np.ndarray, torch.Tensor]:
        """`nbytes` of pinned memory to write in place (numpy) and copy from (torch), for one
        caller's copy soon after: no array packed and copied in between. Raises when larger
        than a segment."""
        at = self._reserve(max(1, nbytes))
        if at is None:
            raise ValueError(f"{nbytes} bytes do not fit a staging segment ({self.segment_bytes})")
        return self.host_np[at : at + nbytes], self.host_bytes[at : at + nbytes]

    def host(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """The arrays as pinned host tensors, for a copy made elsewhere (FlashInfer's plan, a
        CUDA graph's input buffer): asynchronous copies need pinned memory."""
        packed = self._pack(arrays)
        if packed is None:
            return [_pinned(a) for a in arrays]
        return [_view(self.host_bytes, at, a) for at, a in zip(packed[1], arrays)]


def _view(buffer: torch.Tensor, at: int, array: np.ndarray) -> torch.Tensor:
    return buffer[at : at + array.nbytes].view(_TORCH[array.dtype.type])


def _pinned(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).pin_memory()


_staging: dict[torch.device, Staging] = {}


def staging(device: torch.device) -> Staging:
    """The GPU's staging ring (one per device, made on first use)."""
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    ring = _staging.get(device)
    if ring is None:
        ring = _staging[device] = Staging(device)
    return ring


def host_tensor(data, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """A CPU tensor of `data` (a sequence or array), in pinned memory when asked (on a GPU
    machine: a view of the current GPU's staging ring)."""
    array = np.ascontiguousarray(data, dtype=_NUMPY[dtype])
    if not pinned:
        return torch.from_numpy(array)
    return staging(torch.device("cuda", torch.cuda.current_device())).host([array])[0]


def to_device(data, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """`data` on `device`, copied asynchronously from pinned memory when the device is a GPU."""
    array = np.ascontiguousarray(data, dtype=_NUMPY[dtype])
    if device.type != "cuda":
        return torch.from_numpy(array).to(device)
    return staging(device).send([array])[0]


def send_arrays(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Numpy arrays on `device`, each with its own dtype; on a GPU all in one copy."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    if device.type == "cuda":
        return staging(device).send(arrays)
    return [torch.from_numpy(a).to(device) for a in arrays]


def to_device_many(arrays, device: torch.device) -> list[torch.Tensor]:
    """Several int64 arrays on `device`; on a GPU in one copy (slices of one buffer, each
    16-byte aligned: a step sends about a dozen small index arrays, and each separate copy
    costs the host a launch)."""
    if device.type == "cuda":
        return staging(device).send([np.ascontiguousarray(a, dtype=np.int64) for a in arrays])
    out = []
    for a in arrays:
        out.append(torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device))
    return out


def device_name(device: torch.device) -> str:
    """The GPU's name ("NVIDIA H200"), or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


class DeviceTimer:
    """Time spent on the device from its making to stop(): CUDA events on a GPU (read without
    forcing a sync before the work is done anyway), wall time on the CPU.

    On a GPU its two events also mark the step for others (`Engine.forward`): `started`
    follows everything enqueued before the step (the attention plan's copies), `stopped`
    everything in it (the sampled tokens' copy to the host). Each record is a submission to
    the GPU, which costs the host tens of microseconds: a step makes these two and no other."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._ms: float | None = None
        if self.cuda:
            self.started = torch.cuda.Event(enable_timing=True)
            self.stopped = torch.cuda.Event(enable_timing=True)
            # NOTE: looked up once: `record()` without a stream looks it up each time
            self._stream = torch.cuda.current_stream(device)
            self.started.record(self._stream)
        else:
            self._t = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.stopped.record(self._stream)
        else:
            self._ms = (time.perf_counter() - self._t) * 1e3

    def elapsed_ms(self) -> float:
        if self._ms is None:  # on a GPU: read once, when first asked for
            self.stopped.synchronize()
            self._ms = self.started.elapsed_time(self.stopped)
        return self._ms


_NUMPY = {
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.float32: np.float32,
    torch.bool: np.bool_,
    torch.uint8: np.uint8,
}
_TORCH = {numpy: torch_dtype for torch_dtype, numpy in _NUMPY.items()}

"""Device helpers: host-to-device copies that never stall the host, and a device timer.

A copy from pageable memory waits for the stream to drain, which would undo overlap scheduling;
so per-step inputs go through a reused ring of pinned staging memory per GPU, one copy per call.
"""

from __future__ import annotations

import time

import numpy as np
import torch

ALIGN = 16  # bytes: each staged array starts here, for kernels that load with vector width


class Staging:
    """Pinned host memory and device memory of the same layout, used in turn as a ring.

    NOTE: coming back to segment ``s`` waits for the event recorded on leaving ``s + 1``, which
    follows every copy out of ``s``, including those callers make later from `host` views.
    """

    def __init__(self, device: torch.device, segment_bytes: int = 1 << 20, segments: int = 8):
        self.device, self.segment_bytes, self.segments = device, segment_bytes, segments
        total = segment_bytes * segments
        self.host_bytes = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        self.host_np = self.host_bytes.numpy()
        self.device_bytes = torch.empty(total, dtype=torch.uint8, device=device)
        self.left: list[torch.cuda.Event | None] = [None] * segments  # recorded on leaving
        self.segment, self.head = 0, 0

    def _reserve(self, nbytes: int) -> int | None:
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
        """`nbytes` of pinned memory to write in place (numpy) and copy from (torch) soon."""
        at = self._reserve(max(1, nbytes))
        if at is None:
            raise ValueError(f"{nbytes} bytes do not fit a staging segment ({self.segment_bytes})")
        return self.host_np[at : at + nbytes], self.host_bytes[at : at + nbytes]

    def host(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """The arrays as pinned host tensors, for an asynchronous copy made elsewhere."""
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
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    ring = _staging.get(device)
    if ring is None:
        ring = _staging[device] = Staging(device)
    return ring


def host_tensor(data, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """A CPU tensor of `data`, in the current GPU's staging ring when `pinned`."""
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


def to_host(t: torch.Tensor) -> torch.Tensor:
    """`t` on the host: from a GPU, copied (enqueued) into pinned memory of its own, from torch's
    caching host allocator, which takes the block back once the copy is done and the tensor is
    let go; a CPU tensor as it is."""
    if t.device.type != "cuda":
        return t
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)


def to_device_many(arrays, device: torch.device) -> list[torch.Tensor]:
    """Several int64 arrays on `device`; on a GPU in one copy."""
    if device.type == "cuda":
        return staging(device).send([np.ascontiguousarray(a, dtype=np.int64) for a in arrays])
    out = []
    for a in arrays:
        out.append(torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device))
    return out


def device_name(device: torch.device) -> str:
    """The GPU's name, or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


class DeviceTimer:
    """Device time from its making to stop(): CUDA events on a GPU, wall time on the CPU.

    NOTE: its two events also mark the step's bounds for `Engine.forward`; a step records no
    other event, as each record is a submission the host pays for."""

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
        if self._ms is None:
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

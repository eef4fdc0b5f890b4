"""`load`: a trace file (or a shipped slice by name), checked whole, then cut to a window, its
lengths scaled and fitted to a context, its arrivals rescaled."""

from __future__ import annotations

import math
import os
from pathlib import Path

from .. import validate as V
from .formats import read
from .request import FILE_BLOCK_SIZE, TraceRequest, block_count
from .trace import Trace

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "traces"
# the slices that ship in data/traces/ (their sources and licenses: data/traces/README.md)
NAMES = {
    "azure-conv": "azure_conv.csv",
    "azure-code": "azure_code.csv",
    "mooncake": "mooncake_conversation.jsonl",
    "mooncake-synthetic": "mooncake_synthetic.jsonl",
}
LONG = ("clip", "scale", "drop")


def load(
    source: str | os.PathLike,
    format: str | None = None,
    *,
    start: float | None = None,
    duration: float | None = None,
    first: int | None = None,
    time_scale: float | None = None,
    request_rate: float | None = None,
    block_size: int = FILE_BLOCK_SIZE,
    max_len: int | None = None,
    long: str = "clip",
) -> Trace:
    """A trace, every row of its file checked first (a bad one raises ValueError naming the
    file, line and field). Then, in this order:

    - `source`: a shipped slice (`NAMES`: "azure-conv", "azure-code", "mooncake",
      "mooncake-synthetic") or a file's path; `format` ("azure", "mooncake", "csv", "jsonl")
      is told from the file's first line when None.
    - the window: requests arriving from `start` seconds after the first row, for `duration`
      seconds, re-timed from `start`; then the `first` N of them (all of them where the
      window holds fewer: `len(trace)` says how many).
    - `block_size`: tokens per block id; below the files' 512, every length is scaled by
      `block_size / 512` (outputs too), so a trace runs on a tiny model with its sharing kept.
    - `max_len`: the longest prompt + output (a model's context); a longer request is clipped
      (its prompt cut, then its output), dropped, or the whole trace scaled (`long="scale"`: one
      factor for every length, block size included, so that the longest fits). Counted on the
      trace.
    - `time_scale` multiplies the gaps between arrivals (2: half the rate), or `request_rate`
      sets the rate in requests/s (inf: all at once); not both.
    """
    path, name = _resolve(source)
    start = V.real("start", start, 0.0) if start is not None else None
    duration = V.real("duration", duration, 0.0, low_open=True) if duration is not None else None
    first = V.optional_integer("first", first, 1)
    block_size = V.integer("block_size", block_size, 1)
    max_len = V.optional_integer("max_len", max_len, 2)
    long = V.choice("long", long, LONG)
    if time_scale is not None and request_rate is not None:
        raise ValueError("give time_scale or request_rate, not both")
    if time_scale is not None:
        time_scale = V.real("time_scale", time_scale, 0.0)
    if request_rate is not None and request_rate != math.inf:
        request_rate = V.real("request_rate", request_rate, 0.0, low_open=True)

    format, requests = read(path, format)
    file_requests = len(requests)
    requests = _window(requests, start, duration, first, path)
    if block_size != FILE_BLOCK_SIZE:
        requests = [_scaled(r, block_size / FILE_BLOCK_SIZE, block_size) for r in requests]
    requests, fitted = _fit(requests, max_len, long, block_size, path)
    block_size, clipped, dropped = fitted
    requests, time_scale = _retimed(requests, time_scale, request_rate)
    return Trace(
        name=name,
        format=format,
        requests=tuple(requests),
        block_size=block_size,
        length_scale=block_size / FILE_BLOCK_SIZE,
        time_scale=time_scale,
        file_requests=file_requests,
        max_len=max_len,
        long=long,
        clipped_count=clipped,
        dropped_count=dropped,
    )


def _resolve(source: str | os.PathLike) -> tuple[Path, str]:
    if isinstance(source, str) and source in NAMES:
        return DATA_DIR / NAMES[source], source
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"a trace is a shipped name {tuple(NAMES)} or a path, got {source!r}")
    path = Path(source).expanduser()
    if not path.is_file():
        raise ValueError(f"no trace file {str(path)!r}, and not a shipped trace {tuple(NAMES)}")
    return path, str(source)


def _window(requests: list[TraceRequest], start, duration, first, path: Path) -> list[TraceRequest]:
    if start is not None or duration is not None:
        begin = start or 0.0
        end = begin + duration if duration is not None else math.inf
        requests = [
            r._replace(arrival_s=r.arrival_s - begin)
            for r in requests
            if begin <= r.arrival_s < end
        ]
        if not requests:
            raise ValueError(
                f"{path}: no request arrives in the window start={start} s, duration={duration} s"
            )
    return requests[:first] if first is not None else requests


def _scaled(r: TraceRequest, ratio: float, block_size: int) -> TraceRequest:
    """`r`'s lengths times `ratio`, its prompt still spanning each of its blocks."""
    prompt = max(1, round(r.prompt_len * ratio))
    if r.hash_ids:
        blocks = len(r.hash_ids)
        prompt = min(max(prompt, (blocks - 1) * block_size + 1), blocks * block_size)
    return r._replace(prompt_len=prompt, output_len=max(1, round(r.output_len * ratio)))


def _clipped(r: TraceRequest, max_len: int, block_size: int) -> TraceRequest:
    prompt = max(1, max_len - r.output_len)
    output = min(r.output_len, max_len - prompt)
    return r._replace(
        prompt_len=prompt,
        output_len=output,
        hash_ids=r.hash_ids[: block_count(prompt, block_size)],
    )


def _fit(
    requests: list[TraceRequest], max_len: int | None, long: str, block_size: int, path: Path
) -> tuple[list[TraceRequest], tuple[int, int, int]]:
    """The requests within `max_len`, and (block size, clipped count, dropped count)."""

    def too_long(r: TraceRequest) -> bool:
        return r.prompt_len + r.output_len > max_len

    if max_len is None or not any(too_long(r) for r in requests):
        return requests, (block_size, 0, 0)
    if long == "drop":
        kept = [r for r in requests if not too_long(r)]
        if not kept:
            raise ValueError(f"{path}: every request is longer than max_len={max_len}")
        return kept, (block_size, 0, len(requests) - len(kept))
    if long == "scale":
        longest = max(r.prompt_len + r.output_len for r in requests)
        scaled_block = max(1, math.floor(block_size * max_len / longest))
        ratio = scaled_block / block_size
        requests, block_size = [_scaled(r, ratio, scaled_block) for r in requests], scaled_block
    # clip (after scaling: what rounding left a token or so too long)
    clipped = sum(too_long(r) for r in requests)
    requests = [_clipped(r, max_len, block_size) if too_long(r) else r for r in requests]
    return requests, (block_size, clipped, 0)


def _retimed(
    requests: list[TraceRequest], time_scale: float | None, request_rate: float | None
) -> tuple[list[TraceRequest], float]:
    if request_rate is not None:
        span = requests[-1].arrival_s - requests[0].arrival_s
        if math.isinf(request_rate):
            time_scale = 0.0
        elif span == 0:
            raise ValueError(
                f"request_rate={request_rate}: the trace's {len(requests)} requests arrive at "
                "once, there is no rate to scale"
            )
        else:
            time_scale = len(requests) / span / request_rate
    if time_scale is None or time_scale == 1.0:
        return requests, 1.0
    return [r._replace(arrival_s=r.arrival_s * time_scale) for r in requests], time_scale

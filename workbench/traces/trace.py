"""`Trace`: a recorded workload, its requests' arrival times and lengths and the prefix blocks
they share, loaded (`load`) and ready to replay (`to_requests`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

from .. import validate as V
from ..core import SamplingParams
from .ideal import Reuse, ideal_reuse
from .prompts import trace_prompts
from .request import FILE_BLOCK_SIZE, TraceRequest

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Trace:
    """Requests as a production trace recorded them (`load` makes one): arrival seconds from the
    trace's start, prompt and output lengths, and the prompt's prefix blocks (`hash_ids`, as
    Mooncake's traces give them; none for Azure's). What loading changed is counted here."""

    name: str  # the shipped trace's name, or the file's path
    format: str  # "azure", "mooncake", "csv" or "jsonl"
    requests: tuple[TraceRequest, ...]
    block_size: int = FILE_BLOCK_SIZE  # tokens per block id: the file's 512 x length_scale
    length_scale: float = 1.0  # a length here over its length in the file (before clipping)
    time_scale: float = 1.0  # a gap between arrivals here over the file's
    file_requests: int = 0  # rows in the file, before the window
    max_len: int | None = None  # the longest prompt + output allowed (None: any)
    long: str = "clip"  # what became of longer requests: "clip", "scale" or "drop"
    clipped_count: int = 0  # requests cut to max_len
    dropped_count: int = 0  # requests left out for being longer than max_len

    def __post_init__(self) -> None:
        if not self.requests:
            raise ValueError(f"requests: a trace holds at least one request, got {self.requests!r}")

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def arrivals(self) -> list[float]:
        return [r.arrival_s for r in self.requests]

    @property
    def prompt_lens(self) -> list[int]:
        return [r.prompt_len for r in self.requests]

    @property
    def output_lens(self) -> list[int]:
        return [r.output_len for r in self.requests]

    @property
    def duration_s(self) -> float:
        """From the first arrival to the last."""
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    @property
    def rate(self) -> float:
        """Requests per second over `duration_s` (inf when they all arrive at once)."""
        span = self.duration_s
        return len(self.requests) / span if span > 0 else float("inf")

    @cached_property
    def ideal(self) -> Reuse:
        """The prefix reuse an unbounded cache would see, requests one at a time in trace order."""
        return ideal_reuse(self.requests, self.block_size)

    def summary(self) -> dict:
        """Requests, their rate and median lengths, the ideal prefix reuse, what loading did."""
        ideal = self.ideal
        return dict(
            name=self.name,
            format=self.format,
            requests=len(self.requests),
            file_requests=self.file_requests,
            duration_s=round(self.duration_s, 3),
            rate=round(self.rate, 3),
            prompt_len_median=statistics.median(self.prompt_lens),
            output_len_median=statistics.median(self.output_lens),
            prompt_len_max=max(self.prompt_lens),
            block_size=self.block_size,
            ideal_token_hit_rate=round(ideal.token_hit_rate, 4),
            ideal_block_hit_rate=round(ideal.block_hit_rate, 4),
            length_scale=self.length_scale,
            time_scale=self.time_scale,
            max_len=self.max_len,
            long=self.long,
            clipped=self.clipped_count,
            dropped=self.dropped_count,
        )

    def __repr__(self) -> str:
        s = self.summary()
        scaled = []
        if s["length_scale"] != 1.0:
            scaled.append(f"lengths x {s['length_scale']:.4g}")
        if s["time_scale"] != 1.0:
            scaled.append(f"time x {s['time_scale']:.4g}")
        if s["max_len"] is not None:
            scaled.append(
                f"max_len {s['max_len']} ({s['long']}): {s['clipped']} clipped, "
                f"{s['dropped']} dropped"
            )
        return (
            f"Trace({s['name']}, {s['format']}: {s['requests']} of {s['file_requests']} requests "
            f"over {s['duration_s']:.1f} s, {s['rate']:.3g}/s; median prompt "
            f"{s['prompt_len_median']:,.0f} tokens, output {s['output_len_median']:,.0f}; ideal "
            f"prefix reuse {s['ideal_token_hit_rate']:.1%} of tokens, "
            f"{s['ideal_block_hit_rate']:.1%} of blocks of {s['block_size']}"
            + "".join(f"; {x}" for x in scaled)
            + ")"
        )

    def to_pandas(self) -> pd.DataFrame:
        """One row per request: arrival_s, prompt_len, output_len, hash_ids."""
        import pandas as pd

        return pd.DataFrame(self.requests, columns=TraceRequest._fields)

    def to_requests(
        self, vocab_size: int, seed: int = 0, sampling: SamplingParams | None = None
    ) -> list[tuple[list[int], SamplingParams, float]]:
        """``(prompt ids, sampling, arrival seconds)`` per request, what `Workbench.compare(...,
        arrival="time")` takes. Equal block ids are equal blocks of `block_size` random tokens
        below `vocab_size`, distinct ones distinct (seeded by `seed`); a request without block
        ids gets tokens of its own. `sampling` (greedy by default) with each request's output
        length as `max_tokens` and EOS ignored, so every request runs its recorded length."""
        vocab_size = V.integer("vocab_size", vocab_size, 1)
        seed = V.integer("seed", seed, 0)
        sampling = sampling if sampling is not None else SamplingParams()
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams or None, got {sampling!r}")
        prompts = trace_prompts(self.requests, self.block_size, vocab_size, seed)
        return [
            (ids, replace(sampling, max_tokens=r.output_len, ignore_eos=True), r.arrival_s)
            for ids, r in zip(prompts, self.requests)
        ]

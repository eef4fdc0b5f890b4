"""`bench --dataset-name azure-conv|azure-code|mooncake|mooncake-synthetic|trace`: a production
trace's requests as the workload (the slice that ships, or `--dataset-path`), arriving at the
trace's times (`--request-rate` rescales them), and the run's prefix-cache hits beside the
trace's own ideal."""

from __future__ import annotations

import argparse

from ..llm import LLM
from ..traces import Trace, load
from ..traces.ideal import run_reuse
from .workload import Workload, prompt_vocab, random_workload

# --dataset-name -> the trace format of its files (None: told by the file's first line)
DATASETS = {
    "azure-conv": "azure",
    "azure-code": "azure",
    "mooncake": "mooncake",
    "mooncake-synthetic": "mooncake",
    "trace": None,
}


def bench_workload(llm: LLM, args: argparse.Namespace) -> tuple[Workload, Trace | None]:
    """The workload --dataset-name names, and its trace (None: 'random')."""
    if args.dataset_name != "random":
        return load_dataset(llm, args)
    work = random_workload(
        args.num_requests, args.input_len, args.output_len, args.seed, prompt_vocab(llm)
    )
    return work, None


def load_dataset(llm: LLM, args: argparse.Namespace) -> tuple[Workload, Trace]:
    """The first --num-requests of the trace, its lengths scaled by --trace-block-size / 512 (the
    traces' own blocks by default) and clipped to what the engine can hold, its arrivals at
    --request-rate if given."""
    name = args.dataset_name
    max_len = min(llm.engine.max_seq_len, llm.scheduler.cache.total_size)
    trace = load(
        args.dataset_path or name,
        DATASETS[name],
        first=args.num_requests,
        request_rate=args.request_rate,
        block_size=args.trace_block_size or 512,
        max_len=max_len,
    )
    vocab_size = llm.engine.model_config.vocab_size
    requests = trace.to_requests(vocab_size, seed=args.seed)
    workload = Workload(
        [ids for ids, _, _ in requests], trace.output_lens, [t for _, _, t in requests]
    )
    return workload, trace


def reuse_result(trace: Trace, cached_lens: list[int]) -> dict:
    """The run's prefix-cache hits (each request's cached tokens at admission) and the trace's
    ideal (an unbounded cache, requests one at a time in trace order), as the JSON has them."""
    run = run_reuse(trace.prompt_lens, cached_lens, trace.block_size)
    out = {"block_size": trace.block_size}
    for key, reuse in (("run", run), ("ideal", trace.ideal)):
        out[key] = {
            **reuse._asdict(),
            "token_hit_rate": round(reuse.token_hit_rate, 4),
            "block_hit_rate": round(reuse.block_hit_rate, 4),
        }
    return out


def trace_line(summary: dict) -> str:
    """The trace as the bench ran it, in one line."""
    s = summary
    scaled = f", lengths x {s['length_scale']:.4g}" if s["length_scale"] != 1 else ""
    timed = f", arrivals x {s['time_scale']:.4g}" if s["time_scale"] != 1 else ""
    return (
        f"dataset {s['name']} ({s['format']}): {s['requests']} of {s['file_requests']} requests "
        f"over {s['duration_s']:.1f} s ({s['rate']:.3g}/s{timed}), median prompt "
        f"{s['prompt_len_median']:,.0f} tokens, output {s['output_len_median']:,.0f}{scaled}; "
        f"{s['clipped']} clipped to {s['max_len']} tokens"
    )


def reuse_line(reuse: dict) -> str:
    run, ideal = reuse["run"], reuse["ideal"]
    return (
        f"prefix cache hits: {run['token_hit_rate']:.1%} of prompt tokens ({run['hit_tokens']:,} "
        f"of {run['prompt_tokens']:,}), {run['block_hit_rate']:.1%} of blocks of "
        f"{reuse['block_size']} ({run['hit_blocks']:,} of {run['prompt_blocks']:,}); the trace's "
        f"ideal {ideal['token_hit_rate']:.1%} of tokens, {ideal['block_hit_rate']:.1%} of blocks "
        "(an unbounded cache, requests one at a time in trace order)"
    )

"""Does the HTTP server slow the engine? The same requests through `LLM.generate` and through the
server, from N concurrent streaming clients in processes of their own (as real clients are).

    python benchmarks/serve_load.py [--model smollm2] [--clients 64 256] [--output-len 64]
        [--openai] [--client-processes P]
    python benchmarks/serve_load.py --model dummy:qwen3-0.6b --clients 256 --per-client 1 \
        --input-len 100 1024 --output-len 100 1024        # nano-vllm's workload, on a GPU

For each number of clients: output tokens per second of `LLM.generate` on the requests (the
engine with as many request slots as clients), then, the prefix cache emptied, of the server
with that many clients, each sending its share of the requests one after another, streamed
(`stream: true`, usage asked for). The clients are raw HTTP streams that read the bytes as they
come (a load generator made for this server's OpenAI-compatible API, cheap enough not to be what
is measured), or with `--openai` the `openai` library's `AsyncOpenAI`, which parses every event
(spread over P processes). Printed: the ratio; the clients' TTFT and ITL percentiles (ITL: the
gaps between a stream's successive events with tokens, as they arrived); and where the server's
time went: the engine's steps (how many, how long, how much of the wall time they filled)
against generate's, the CPU time of each process, and the engine's thread while served: its
time in steps, exchanging with the HTTP process (reading and adding requests, sending each
step's tokens: neither waits on the HTTP process, whose socket the engine never blocks on) and
idle with nothing to step, and the most bytes that waited for the HTTP process to read them
(`serve.loop.LoopTimes`); and how far behind the HTTP process ran
(`workbench_step_delivery_seconds`: a step's tokens from the engine's send to the responses).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PERCENTILES = (50, 95, 99)


def workload(
    count: int, vocab: int, input_len: tuple[int, int], output_len: tuple[int, int], seed: int = 0
) -> list[tuple[list[int], int]]:
    """`count` prompts of random ids and lengths, each with its output length."""
    rng = random.Random(seed)
    high = min(vocab, 49152) - 1
    return [
        (
            [rng.randrange(100, high) for _ in range(rng.randint(*input_len))],
            rng.randint(*output_len),
        )
        for _ in range(count)
    ]


def run_generate(llm, requests: list[tuple[list[int], int]]) -> dict:
    from workbench.core import SamplingParams

    prompts = [p for p, _ in requests]
    sampling = [SamplingParams(max_tokens=n, ignore_eos=True) for _, n in requests]
    steps_before = len(llm.history)
    started = time.perf_counter()
    outputs = llm.generate(prompts, sampling)
    seconds = time.perf_counter() - started
    tokens = sum(o["completion_tokens"] for o in outputs)
    return {"tokens": tokens, "seconds": seconds, **_steps(llm, steps_before, seconds)}


def run_served(
    llm, requests: list[tuple[list[int], int]], clients: int, processes: int, kind: str
) -> dict:
    """The requests from `clients` streaming clients in `processes` processes of their own; the
    CPU time each process spent while they ran (the engine's, the HTTP process's, the clients'),
    and the engine's thread's time (`LoopTimes`) over the same span."""
    server = llm.serve(port=0)
    try:
        load = Clients(server.url, server.name, requests, clients, processes, kind)
        try:
            pids = {"http": [server._process.pid], "clients": load.pids}
            before = {name: _cpu_s(p) for name, p in pids.items()}
            engine_before, steps_before = time.process_time(), len(llm.history)
            loop_before = dataclasses.replace(server.loop.times)
            result = load.run()
            loop = _since(server.loop.times, loop_before)
            delivery = _delivery(server.url)
            cpu = {name: _cpu_s(p) - before[name] for name, p in pids.items()}
            cpu["engine"] = time.process_time() - engine_before
        finally:
            load.close()
    finally:
        llm.stop_serving()
    steps = _steps(llm, steps_before, result["seconds"])
    return {**result, "cpu_s": cpu, "loop": loop, "delivery": delivery, **steps}


def _delivery(url: str) -> str:
    """The HTTP process's delivery of the engine's step messages (`/metrics`): their count, mean
    and the bucket bound under which 99% fell (a server serves one run, so it is this run's)."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    text = urlopen(url.removesuffix("/v1") + "/metrics", timeout=30).read().decode()
    (family,) = (
        f
        for f in text_string_to_metric_families(text)
        if f.name == "workbench_step_delivery_seconds"
    )
    buckets = [
        (float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")
    ]
    count = next(s.value for s in family.samples if s.name.endswith("_count"))
    total = next(s.value for s in family.samples if s.name.endswith("_sum"))
    if not count:
        return "no step message"
    p99 = next(le for le, n in sorted(buckets) if n >= 0.99 * count)
    return (
        f"{int(count)} step messages, {total / count * 1e3:.3f} ms on average from the engine's "
        f"send to the responses, 99% within {p99 * 1e3:g} ms"
    )


def _since(now, before):
    """The engine thread's times between two readings (the largest exchange: over the run)."""
    fields = ("turns", "steps", "stepping_s", "read_s", "send_s", "idle_s")
    since = {f: getattr(now, f) - getattr(before, f) for f in fields}
    return dataclasses.replace(now, **since)


def _cpu_s(pids: list[int]) -> float:
    """Processes' CPU seconds so far (Linux's /proc; NaN elsewhere)."""
    try:
        stats = [Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() for pid in pids]
    except OSError:
        return float("nan")
    return sum(int(f[11]) + int(f[12]) for f in stats) / os.sysconf("SC_CLK_TCK")


def _steps(llm, since: int, seconds: float) -> dict:
    """The engine's steps of the run (record="light"): count, median time, and how much of the
    run's wall time they filled."""
    records = llm.history.records[since:]
    walls = [r.wall_ms for r in records]
    return {
        "steps": len(records),
        "step_ms": float(np.median(walls)) if walls else float("nan"),
        "busy": sum(walls) / 1e3 / seconds if seconds else float("nan"),
    }


# -- the clients, in processes of their own ---------------------------------------------------
async def _raw_stream(url: str, body: bytes) -> tuple[list[float], int]:
    """One streamed request over its own connection: the bytes are read as they come and nothing
    is parsed but the last event (its usage): a client in Python parsing every event of hundreds
    of streams through an HTTP library was the slowest part of the measurement (0.25 ms a read).
    The arrival of each event with tokens (those of one read arrived together), and the
    completion tokens."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + body)
    times, tail, edge = [], b"", b""
    while chunk := await reader.read(65536):
        now = time.perf_counter()
        times += [now] * (edge + chunk).count(b"data: {")  # the events that began in this read
        edge, tail = chunk[-6:], (tail + chunk)[-4096:]
    writer.close()
    usage = json.loads(b"{" + tail.rsplit(b"data: {", 1)[-1].split(b"\n\n", 1)[0])["usage"]
    return times[:-1], usage["completion_tokens"]  # the last event is the usage


async def _openai_stream(client, model: str, prompt: list[int], max_tokens: int):
    """One streamed request through the `openai` client: the arrival of each chunk with tokens,
    and the completion tokens of the usage chunk."""
    stream = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    reads, tokens = [], 0
    async for chunk in stream:
        if chunk.choices:
            reads.append(time.perf_counter())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return reads, tokens


async def _client(spec: dict) -> dict:
    """This process's clients: each sends its share of the requests one after another, streamed.
    For each request its TTFT (to the first event with tokens) and its ITL samples: the gaps
    between its successive events as they arrived, as OpenAI-compatible load generators count
    them (events that came in one read arrived together: a gap of 0)."""
    shares = spec["shares"]
    ttft, itl, tokens, events = [], [], 0, 0
    if spec["openai"]:
        import openai

        client = openai.AsyncOpenAI(
            base_url=spec["url"], api_key="none", max_retries=0, timeout=600
        )

    async def one(prompt: list[int], max_tokens: int) -> None:
        nonlocal tokens, events
        start = time.perf_counter()
        if spec["openai"]:
            reads, count = await _openai_stream(client, spec["model"], prompt, max_tokens)
        else:
            body = {
                "model": spec["model"],
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            reads, count = await _raw_stream(spec["url"], json.dumps(body).encode())
        ttft.append((reads[0] if reads else time.perf_counter()) - start)
        itl.extend(np.diff(reads).tolist())
        tokens, events = tokens + count, events + len(reads)

    async def serve_share(share: list[list]) -> None:
        for prompt, max_tokens in share:
            await one(prompt, max_tokens)

    started = time.perf_counter()
    await asyncio.gather(*(serve_share(s) for s in shares))
    return {
        "started": started,
        "ended": time.perf_counter(),
        "tokens": tokens,
        "events": events,
        "ttft_s": ttft,
        "itl_s": itl,
    }


class Clients:
    """`clients` streaming clients in `processes` processes of their own (as real clients are),
    started and waiting; `run()` tells them to go at once and merges their samples, `close()`
    ends them."""

    def __init__(self, url: str, model: str, requests: list, clients: int, processes: int, kind):
        shares = [requests[i::clients] for i in range(clients)]
        self.tmp = tempfile.TemporaryDirectory()
        self.procs = []
        for p in range(processes):
            spec = Path(self.tmp.name) / f"spec{p}.json"
            mine = {"url": url, "model": model, "openai": kind == "openai"}
            spec.write_text(json.dumps({**mine, "shares": shares[p::processes]}))
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--client", str(spec)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                )
            )
        for proc in self.procs:
            assert proc.stdout.readline().strip() == "ready"  # its imports done
        self.pids = [proc.pid for proc in self.procs]

    def run(self) -> dict:
        for proc in self.procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        parts = [json.loads(proc.stdout.readline()) for proc in self.procs]
        ttft = [t * 1e3 for part in parts for t in part["ttft_s"]]
        itl = [t * 1e3 for part in parts for t in part["itl_s"]]
        tokens = sum(part["tokens"] for part in parts)
        events = sum(part["events"] for part in parts)
        return {
            "tokens": tokens,
            "seconds": max(p["ended"] for p in parts) - min(p["started"] for p in parts),
            "ttft_ms": [float(np.percentile(ttft, q)) for q in PERCENTILES],
            "itl_ms": [float(np.percentile(itl, q)) for q in PERCENTILES] if itl else [0.0] * 3,
            "tokens_per_event": tokens / events if events else float("nan"),
        }

    def close(self) -> None:
        """After their CPU time is read: the processes end once they have answered (one that
        has not within a minute, after a failure, is killed)."""
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.tmp.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--clients", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--per-client", type=int, default=4, help="requests each client sends")
    parser.add_argument("--input-len", type=int, nargs=2, default=[16, 64])
    parser.add_argument("--output-len", type=int, nargs="+", default=[64], help="N or MIN MAX")
    parser.add_argument(
        "--openai", action="store_true", help="clients of the `openai` library (AsyncOpenAI)"
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        help="processes the clients are spread over (default: 1; with --openai, half the cores "
        "up to 8: the library parses every event)",
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)  # the client process's spec
    args = parser.parse_args(argv)
    kind = "openai" if args.openai else "raw"
    processes = args.client_processes or (min(8, max(1, os.cpu_count() // 2)) if args.openai else 1)
    if processes < 1:
        parser.error(f"--client-processes must be >= 1, got {processes}")
    if args.client:  # ready once imported; then the requests, when told to go
        spec = json.loads(Path(args.client).read_text())
        print("ready", flush=True)
        sys.stdin.readline()
        print(json.dumps(asyncio.run(_client(spec))), flush=True)
        return
    import torch

    from workbench.llm import LLM

    for clients in args.clients:
        llm = LLM(args.model, max_running_reqs=clients, record="light")
        vocab = llm.engine.model_config.vocab_size
        output_len = (args.output_len[0], args.output_len[-1])
        requests = workload(clients * args.per_client, vocab, tuple(args.input_len), output_len)
        base = run_generate(llm, requests)
        llm.reconfigure()  # the same settings, an empty prefix cache: no head start from above
        served = run_served(llm, requests, clients, min(processes, clients), kind)
        llm.check_integrity()
        llm.close()
        rate = base["tokens"] / base["seconds"]
        served_rate = served["tokens"] / served["seconds"]
        print(
            f"{args.model} on {'cuda' if torch.cuda.is_available() else 'cpu'}, {clients} "
            f"streaming clients, {len(requests)} requests of {args.input_len[0]}-"
            f"{args.input_len[1]} prompt and {output_len[0]}-{output_len[1]} output tokens "
            f"({'the openai client' if args.openai else 'raw HTTP clients'}, "
            f"{min(processes, clients)} client process(es)):"
        )
        print(
            f"  LLM.generate {rate:,.0f} tok/s ({base['steps']} steps, median "
            f"{base['step_ms']:.2f} ms, {base['busy']:.0%} of the time in steps)"
        )
        print(
            f"  served       {served_rate:,.0f} tok/s = {served_rate / rate:.0%} of generate's "
            f"({served['steps']} steps, median {served['step_ms']:.2f} ms, {served['busy']:.0%} "
            f"of the time in steps)"
        )
        ttft, itl = (" / ".join(f"{v:.1f}" for v in served[k]) for k in ("ttft_ms", "itl_ms"))
        print(
            f"  TTFT p50 / p95 / p99 {ttft} ms; ITL p50 / p95 / p99 {itl} ms "
            f"({served['tokens_per_event']:.2f} tokens an event)"
        )
        cpu = served["cpu_s"]
        print(
            f"  CPU while served: the engine's process {cpu['engine']:.2f} s, the HTTP "
            f"process {cpu['http']:.2f} s, the clients' {cpu['clients']:.2f} s, in "
            f"{served['seconds']:.2f} s of wall time ({os.cpu_count()} cores)"
        )
        print(f"  the engine's thread while served: {served['loop']}")
        print(f"  the HTTP process: {served['delivery']}")


if __name__ == "__main__":
    main()

"""Does the HTTP server slow the engine? The same requests through `LLM.generate` and through the
server, from N concurrent streaming clients in another process (as real clients are).

    python benchmarks/serve_load.py [--model smollm2] [--clients 64 256] [--output-len 64]
    python benchmarks/serve_load.py --model dummy:qwen3-0.6b --clients 256 --per-client 1 \
        --input-len 100 1024 --output-len 100 1024        # nano-vllm's workload, on a GPU

For each number of clients: output tokens per second of `LLM.generate` on the requests (the
engine with as many request slots as clients), then, the prefix cache emptied, of the server
with that many clients, each
sending its share of the requests one after another, streamed (`stream: true`, the token ids
asked for so the clients count tokens without detokenising); the ratio; the clients' TTFT and
ITL percentiles; and where the server's time went: the engine's steps (how many, how long, how
much of the wall time they filled) against generate's, and the engine's thread while served:
its time in steps, exchanging with the HTTP process (reading requests, sending each step's
tokens: a step waiting on the HTTP side would show here, as a send blocked on a full pipe) and
idle with nothing to step (`serve.loop.LoopTimes`); and how far behind the HTTP process ran
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


def run_served(llm, requests: list[tuple[list[int], int]], clients: int) -> dict:
    """The requests from `clients` streaming clients in a process of their own; the CPU time
    each process spent while they ran (the engine's, the HTTP process's, the clients'), and the
    engine's thread's time (`LoopTimes`) over the same span."""
    server = llm.serve(port=0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            spec = Path(tmp) / "spec.json"
            spec.write_text(
                json.dumps(
                    {
                        "url": server.url,
                        "requests": requests,
                        "clients": clients,
                        "model": server.name,
                    }
                )
            )
            client = subprocess.Popen(
                [sys.executable, __file__, "--client", str(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
            assert client.stdout.readline().strip() == "ready"  # its imports done
            pids = {"http": server._process.pid, "clients": client.pid}
            before = {name: _cpu_s(pid) for name, pid in pids.items()}
            engine_before, steps_before = time.process_time(), len(llm.history)
            loop_before = dataclasses.replace(server.loop.times)
            client.stdin.write("go\n")
            client.stdin.flush()
            result = json.loads(client.stdout.readline())
            loop = _since(server.loop.times, loop_before)
            delivery = _delivery(server.url)
            cpu = {name: _cpu_s(pid) - before[name] for name, pid in pids.items()}
            cpu["engine"] = time.process_time() - engine_before
            client.wait()
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


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (Linux's /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


# -- the clients, in a process of their own ---------------------------------------------------
async def _client(spec: dict) -> dict:
    """`clients` concurrent streams over the requests, each client's one after another. The
    bytes are read as they come, with a connection per request, and nothing is parsed but the
    last event (its usage): a client in Python parsing every event of hundreds of streams
    through an HTTP library was the slowest part of the measurement (0.25 ms a read)."""
    requests, clients = spec["requests"], spec["clients"]
    shares = [requests[i::clients] for i in range(clients)]
    host, port = spec["url"].split("//")[1].split("/")[0].split(":")
    timings: list[tuple[float, int, float | None]] = []  # ttft, tokens, tpot

    async def one(prompt: list[int], max_tokens: int) -> None:
        body = json.dumps(
            {
                "model": spec["model"],
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        start = time.perf_counter()
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head + body)
        first = last = None
        tail = b""
        while chunk := await reader.read(65536):
            now = time.perf_counter()
            if first is None and b"data: {" in chunk:
                first = now
            last, tail = now, (tail + chunk)[-4096:]
        writer.close()
        event = b"{" + tail.rsplit(b"data: {", 1)[-1].split(b"\n\n", 1)[0]
        count = json.loads(event)["usage"]["completion_tokens"]
        tpot = (last - first) / (count - 1) if count > 1 and first is not None else None
        timings.append(((first or start) - start, count, tpot))

    async def serve_share(share: list[list]) -> None:
        for prompt, max_tokens in share:
            await one(prompt, max_tokens)

    started = time.perf_counter()
    await asyncio.gather(*(serve_share(s) for s in shares))
    seconds = time.perf_counter() - started
    ttft = [t[0] * 1e3 for t in timings]
    tpot = [t[2] * 1e3 for t in timings if t[2] is not None]
    return {
        "tokens": sum(t[1] for t in timings),
        "seconds": seconds,
        "ttft_ms": [float(np.percentile(ttft, q)) for q in (50, 99)],
        "tpot_ms": [float(np.percentile(tpot, q)) for q in (50, 99)] if tpot else [0, 0],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--clients", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--per-client", type=int, default=4, help="requests each client sends")
    parser.add_argument("--input-len", type=int, nargs=2, default=[16, 64])
    parser.add_argument("--output-len", type=int, nargs="+", default=[64], help="N or MIN MAX")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # the client process's spec
    args = parser.parse_args(argv)
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
        served = run_served(llm, requests, clients)
        llm.check_integrity()
        llm.close()
        rate = base["tokens"] / base["seconds"]
        served_rate = served["tokens"] / served["seconds"]
        print(
            f"{args.model} on {'cuda' if torch.cuda.is_available() else 'cpu'}, {clients} "
            f"streaming clients, {len(requests)} requests of {args.input_len[0]}-"
            f"{args.input_len[1]} prompt and {output_len[0]}-{output_len[1]} output tokens:"
        )
        print(
            f"  LLM.generate {rate:,.0f} tok/s ({base['steps']} steps, median "
            f"{base['step_ms']:.2f} ms, {base['busy']:.0%} of the time in steps)"
        )
        print(
            f"  served       {served_rate:,.0f} tok/s = {served_rate / rate:.0%} of generate's "
            f"({served['steps']} steps, median {served['step_ms']:.2f} ms, {served['busy']:.0%} "
            f"of the time in steps); TTFT p50 / p99 {served['ttft_ms'][0]:.1f} / "
            f"{served['ttft_ms'][1]:.1f} ms, TPOT p50 / p99 {served['tpot_ms'][0]:.2f} / "
            f"{served['tpot_ms'][1]:.2f} ms"
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

"""`python -m workbench serve`: the engine behind an OpenAI-compatible HTTP server, with the
flags `bench` takes. Ctrl-C stops it.

    python -m workbench serve --model smollm2 --port 8000
    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8}'
"""

from __future__ import annotations

import argparse
import time

from .flags import add_engine_arguments, add_schedule_arguments, integer_flag, llm_options
from .llm import LLM
from .serve import MAX_QUEUED_REQUESTS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "--model-path", dest="model", default="smollm2", help="name or path")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument(
        "--port",
        type=integer_flag("port", 0, 65535),
        default=8000,
        help="the port (0: any free one)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the name clients ask for (default: --model); the model's own name works too",
    )
    p.add_argument(
        "--max-queued-requests",
        type=integer_flag("max_queued_requests", 1),
        default=MAX_QUEUED_REQUESTS,
        help="waiting requests (admitted requests not counted) beyond which a request gets "
        "503 with Retry-After",
    )
    p.add_argument(
        "--stream-interval",
        type=integer_flag("stream_interval", 1),
        default=1,
        help="tokens a streamed chunk waits for (SGLang's flag): more, and fewer, larger chunks",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    add_schedule_arguments(p, max_extend_tokens=8192, max_running_reqs=256)
    add_engine_arguments(p, record="off")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other EngineConfig field, e.g. --option memory_ratio=0.8 (repeatable)",
    )


def run(args: argparse.Namespace) -> None:
    llm = LLM(args.model, **llm_options(args))
    try:
        server = llm.serve(
            args.port,
            args.host,
            args.served_model_name,
            args.max_queued_requests,
            args.stream_interval,
        )
        print(f"serving {server.name} ({args.model} on {llm.engine.device}) at {server.url}")
        print(f"  OpenAI(base_url={server.url!r}, api_key='none'); /metrics, /health; Ctrl-C stops")
        while server.serving:
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping: requests in flight end with finish_reason 'abort'")
    finally:
        llm.close()

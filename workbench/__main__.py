"""Command line: ``python -m workbench demo | bench``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="SmolLM2 on a handful of prompts, one line per step")
    demo.add_argument("--model", default="smollm2")
    demo.add_argument("--device", default=None)
    demo.add_argument("--max-extend-tokens", type=int, default=48)
    demo.add_argument("--page-size", type=int, default=1)
    demo.add_argument("--cache", default="radix")
    demo.add_argument(
        "--policy", default="prefill_first", help="prefill_first, decode_first, mixed"
    )
    demo.add_argument("--max-running-reqs", type=int, default=4)
    demo.add_argument("--record", default="full", choices=["off", "light", "full"])
    demo.add_argument("--out", default="out/demo", help="where the run and the report go")
    bench = sub.add_parser("bench", help="offline throughput benchmark")
    from .bench.throughput import add_arguments

    add_arguments(bench)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        run_demo(args)
    elif args.command == "bench":
        from .bench.throughput import main as run_bench

        run_bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

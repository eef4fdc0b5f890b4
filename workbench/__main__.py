"""Command line: ``python -m workbench demo | bench``."""

from __future__ import annotations

import argparse
import sys

from .config import CACHE_KINDS, POLICIES


class HelpWithDefaults(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    helpful = HelpWithDefaults
    demo = sub.add_parser(
        "demo", help="SmolLM2 on a handful of prompts, one line per step", formatter_class=helpful
    )
    demo.add_argument("--model", default="smollm2", help="model name or path")
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    demo.add_argument(
        "--max-extend-tokens",
        "--chunked-prefill-size",
        dest="max_extend_tokens",
        type=int,
        default=48,
        help="the token budget of a batch: the prefill chunk size",
    )
    demo.add_argument("--page-size", type=int, default=1, help="tokens per KV page")
    demo.add_argument("--cache", default="radix", choices=CACHE_KINDS, help="prefix cache")
    demo.add_argument("--policy", default="prefill_first", choices=POLICIES, help="batch policy")
    demo.add_argument(
        "--max-running-reqs",
        "--max-running-requests",
        dest="max_running_reqs",
        type=int,
        default=4,
        help="request slots",
    )
    demo.add_argument(
        "--record", default="full", choices=["off", "light", "full"], help="step records kept"
    )
    demo.add_argument("--out", default="out/demo", help="where the run and the report go")
    bench = sub.add_parser("bench", help="offline throughput benchmark", formatter_class=helpful)
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

"""Command line: ``python -m workbench demo | bench | serve | chat``."""

from __future__ import annotations

import argparse
import sys


class HelpWithDefaults(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def main(argv: list[str] | None = None) -> int:
    # NOTE: no abbreviations: `bench --dev cpu` would otherwise be taken for --device-spec
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__, allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    helpful = dict(formatter_class=HelpWithDefaults, allow_abbrev=False)
    demo = sub.add_parser(
        "demo", help="SmolLM2 on a handful of prompts, one line per step", **helpful
    )
    demo.add_argument(
        "--model", "--model-path", dest="model", default="smollm2", help="model name or path"
    )
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    from .bench.cli import add_arguments
    from .flags import add_schedule_arguments

    add_schedule_arguments(demo, max_extend_tokens=48, max_running_reqs=4)
    # (not "off": the demo's report is drawn from the step records)
    demo.add_argument(
        "--record", default="full", choices=("light", "full"), help="step records kept"
    )
    demo.add_argument("--out", default="out/demo", help="where the run and the report go")
    bench = sub.add_parser("bench", help="offline throughput benchmark", **helpful)
    add_arguments(bench)
    from . import chat as chat_command
    from . import serve_command

    serve = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP server on the engine", **helpful
    )
    serve_command.add_arguments(serve)
    chat = sub.add_parser("chat", help="a conversation in the terminal", **helpful)
    chat_command.add_arguments(chat)
    commands = {"demo": demo, "bench": bench, "serve": serve, "chat": chat}
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own usage, not the top level's
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    from .validate import WrongType

    # (a server that cannot bind its host and port is said so too)
    said = (ValueError, WrongType, OSError) if args.command == "serve" else (ValueError, WrongType)
    try:
        _run(args)
    except said as exc:
        if argv is not None:  # called from Python: the exception is the caller's
            raise
        # from a shell, a value the checks refused (they name the parameter, the value and what
        # is allowed) is said as argparse says a bad flag, without the traceback
        command = commands[args.command]
        command.exit(2, f"{command.prog}: error: {exc}\n")
    except KeyboardInterrupt:  # Ctrl-C in a run (serve and chat end on it themselves)
        if argv is not None:
            raise
        print(f"\n{commands[args.command].prog}: interrupted", file=sys.stderr)
        return 130  # as a shell reports a process ended by SIGINT
    return 0


def _run(args: argparse.Namespace) -> None:
    if args.command == "demo":
        from .demo import run_demo

        run_demo(args)
    elif args.command == "bench":
        from .bench.command import main as run_bench

        run_bench(args)
    elif args.command == "serve":
        from . import serve_command

        serve_command.run(args)
    elif args.command == "chat":
        from . import chat as chat_command

        chat_command.run(args)


if __name__ == "__main__":
    sys.exit(main())

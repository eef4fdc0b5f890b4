"""`python -m workbench bench`: one timed run (throughput.py), or with `--sweep` every combination
of settings (sweep.py); printed as lines (printout.py), a table, or with `--json` as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .cli import resolve_lengths, resolve_record
from .printout import print_result
from .sweep import run_sweep, sweep_table
from .throughput import run_bench


def main(args: argparse.Namespace) -> None:
    """Run the benchmark the parsed flags (`cli.add_arguments`) describe, and print it."""
    resolve_lengths(args)
    resolve_record(args)
    _check_output(args)
    if args.sweep:
        results = run_sweep(args)
        print(json.dumps(results) if args.json else sweep_table(results))
        _write(args, results)
        return
    result = run_bench(args)
    written = {k: v for k, v in result.items() if k != "profile"}
    if args.json:  # (the profile's tables in it, as a sweep's: stdout is JSON alone)
        print(json.dumps(result))
    else:
        if args.profile:
            print(result.pop("profile"))
        print_result(result)
    _write(args, written)


def _check_output(args: argparse.Namespace) -> None:
    """Refuse an --output-file no run could be written to, before the run."""
    if not args.output_file:
        return
    path = Path(args.output_file)
    if path.is_dir() or not path.parent.is_dir():
        why = "is a directory" if path.is_dir() else f"is in no directory ({path.parent} is none)"
        raise ValueError(f"--output-file {str(path)!r} {why}: give a file's path")


def _write(args: argparse.Namespace, results) -> None:
    if args.output_file:
        Path(args.output_file).write_text(json.dumps(results, indent=1) + "\n")

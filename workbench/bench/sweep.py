"""`bench --sweep KEY=V1,V2` (repeatable): every combination in one process, on the same workload,
then a table. KEY is an option of this command or any EngineConfig field."""

from __future__ import annotations

import argparse
import gc
import itertools
import json

import torch

from ..config import KERNEL_OPTIONS
from ..flags import Unlike, parse_value
from .printout import kernels_said, print_result
from .throughput import check_run, run_bench


def sweep_configs(args: argparse.Namespace) -> list[argparse.Namespace]:
    """One namespace per combination of the `--sweep` values (the arguments alone if none);
    each names the settings it varied in `varied`. A value is read as its key's own flag reads
    it, so what the flag refuses, a sweep refuses too, before any run."""
    flags = _bench_flags()
    axes = []
    for spec in args.sweep:
        key, sep, values = spec.partition("=")
        if not sep or not values:
            raise ValueError(f"--sweep wants KEY=V1,V2,..., got {spec!r}")
        said = key.replace("-", "_")
        flag = flags.get(said)
        if isinstance(flag, Unlike):  # vLLM's or SGLang's flag, meaning something else here
            raise ValueError(f"--sweep {said}: {flag.instead}")
        key = flag.dest if flag is not None else said  # (another name of the flag: ours)
        if any(axis[0][0] == key for axis in axes):
            raise ValueError(
                f"--sweep {key} is given twice: give its values once (a value given twice, "
                f"--sweep {key}=A,B,A,B, runs each twice)"
            )
        axes.append([(key, swept_value(said, v, flag)) for v in values.split(",")])
    configs = []
    for combo in itertools.product(*axes):
        run = argparse.Namespace(**vars(args))
        run.option = list(args.option)
        run.varied = dict(combo)
        for key, value in combo:
            if key in ("sweep", "option", "json", "profile", "save", "varied"):
                raise ValueError(f"--sweep cannot vary {key!r}")
            if hasattr(run, key):
                setattr(run, key, value)
            else:
                run.option.append(f"{key}={value!r}")
        configs.append(run)
    return configs


def _bench_flags() -> dict[str, argparse.Action]:
    """`bench`'s flags by the attribute they set (the one that takes a value where several set
    it: `--cache` beside `--disable-radix-cache`), and by the other names of those that take a
    value (SGLang's `chunked_prefill_size`, vLLM's `num_prompts`)."""
    from .cli import add_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    flags: dict[str, argparse.Action] = {}
    for action in parser._actions:  # (argparse has no public list of a parser's flags)
        known = flags.get(action.dest)
        if known is None or (known.nargs == 0 and action.nargs != 0):
            flags[action.dest] = action
    for action in parser._actions:
        if action.nargs != 0:
            for name in action.option_strings:
                flags.setdefault(name.lstrip("-").replace("-", "_"), action)
    return flags


def swept_value(key: str, text: str, flag: argparse.Action | None):
    """One value of `--sweep KEY=...`: read by KEY's flag (its type and choices) where bench has
    one; else an EngineConfig field's, a Python literal (the engine's own checks refuse it)."""
    if flag is None:
        return parse_value(text)
    names = "/".join(flag.option_strings)
    if flag.nargs == 0:  # a switch: on or off
        value = parse_value(text)
        if not isinstance(value, bool):
            raise ValueError(f"--sweep {key}={text}: {names} is a switch, swept as true or false")
        return value
    value = text
    if callable(flag.type):
        try:
            value = flag.type(text)
        except argparse.ArgumentTypeError as exc:  # (our flags' types: they say what is allowed)
            raise ValueError(f"--sweep {key}={text}: {exc}") from None
        except (TypeError, ValueError):
            kind = getattr(flag.type, "__name__", "value")
            raise ValueError(f"--sweep {key}={text}: {names} takes a {kind}") from None
    if flag.choices is not None and value not in flag.choices:
        allowed = ", ".join(map(str, flag.choices))
        raise ValueError(f"--sweep {key}={text}: {names} is one of {allowed}")
    return value


def run_sweep(args: argparse.Namespace) -> list[dict]:
    """Run every configuration in turn, freeing each engine before the next is built."""
    configs = sweep_configs(args)
    for run in configs:
        check_run(run)
    results = []
    for run in configs:
        result = run_bench(run)
        result["varied"] = run.varied
        results.append(result)
        if not args.json:
            if "profile" in result:
                print(result.pop("profile"))
            print_result(result)
            print(flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            left = torch.cuda.memory_allocated() / 2**30
            if left > 1 and not args.json:  # the next run sizes its KV pool from free memory
                print(f"warning: {left:.1f} GiB still allocated after this run")
    return results


def sweep_table(results: list[dict]) -> str:
    """A markdown table: the varied settings, then the figures that matter."""
    keys = list(results[0]["varied"]) if results else []
    head = [*keys, "output tok/s", "seconds", "steps", "decode step ms", "vs first"]
    online = bool(results) and "ttft_ms_p50" in results[0]
    if online:
        head += ["TTFT p50 ms", "TTFT p90 ms", "TPOT p50 ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first = results[0]["output_tokens_per_s"] if results else 1.0
    for r in results:
        cells = [str(r["varied"][k]) for k in keys] + [
            f"{r['output_tokens_per_s']:,.0f}",
            f"{r['seconds']:.2f}",
            str(r["steps"]),
            f"{r['decode_step_ms']:.2f}",
            f"{r['output_tokens_per_s'] / first - 1:+.1%}",
        ]
        if online:
            cells += [f"{r['ttft_ms_p50']:.1f}", f"{r['ttft_ms_p90']:.1f}"]
            cells.append(f"{r['tpot_ms_p50']:.2f}" if "tpot_ms_p50" in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    notes = _spread(results, keys) + _same_kernels(results, keys) + _ran_otherwise(results, keys)
    return "\n".join(lines + notes)


def _spread(results: list[dict], keys: list[str]) -> list[str]:
    """The run-to-run spread the table carries: a setting swept more than once ran twice or more,
    and how far apart its runs fell is what a difference must exceed to be the setting's."""
    if results and all(str(r.get("device", "")).startswith("a twin of") for r in results):
        return [
            "\nA twin's runs are simulated on its virtual clock: a setting gives the same "
            "figures every run, and how far they are from the GPU's is the twin's error "
            "against real runs (docs/twin.md), not a run-to-run spread"
        ]
    runs: dict[tuple, list[float]] = {}
    for r in results:
        runs.setdefault(tuple(r["varied"][k] for k in keys), []).append(r["output_tokens_per_s"])
    repeated = {combo: tps for combo, tps in runs.items() if len(tps) > 1}
    if not repeated:
        values = list(dict.fromkeys(str(r["varied"][keys[0]]) for r in results)) if keys else []
        twice = ",".join(values * 2)
        example = f"--sweep {keys[0]}={twice}" if keys else "a value given twice"
        return [
            "\nEach setting ran once: how far apart two runs of one setting fall here is not "
            f"measured, so no difference above is known to be the setting's ({example} runs "
            "each twice, in rounds; Workbench.compare(..., repeats=N) gives every figure its "
            "noise)"
        ]
    notes = []
    for combo, tps in repeated.items():
        name = ", ".join(f"{k}={v!r}" for k, v in zip(keys, combo, strict=True))
        spread = (max(tps) - min(tps)) / min(tps)
        notes.append(
            f"\n{name} ran {len(tps)} times: {min(tps):,.0f} to {max(tps):,.0f} output tok/s, "
            f"{spread:.1%} apart: differences in the table within that are run-to-run spread"
        )
    return notes


def _same_kernels(results: list[dict], keys: list[str]) -> list[str]:
    """Where only kernel options were varied: which runs ran the same kernels all the same
    (an option this device cannot take resolves as the others do: `Engine.kernels`)."""
    if not keys or not set(keys) <= set(KERNEL_OPTIONS):
        return []
    alike: dict[str, list[dict]] = {}
    for r in results:
        if r.get("kernels") is not None:
            alike.setdefault(json.dumps(r["kernels"], sort_keys=True), []).append(r)
    notes = []
    for runs in alike.values():
        if len(runs) > 1:
            names = " and ".join(", ".join(f"{k}={r['varied'][k]!r}" for k in keys) for r in runs)
            notes.append(
                f"\n{names} ran the same kernels here ({kernels_said(runs[0]['kernels'])}): "
                "their differences are the run-to-run spread, not the option's"
            )
    return notes


def _ran_otherwise(results: list[dict], keys: list[str]) -> list[str]:
    """A switch swept on that ran off (CUDA graphs on a CPU): its column says what was asked,
    and this what ran (the result's own field, as the engine resolved it)."""
    notes = []
    for key in keys:
        asked_ran = {
            (r["varied"][key], r[key])
            for r in results
            if isinstance(r["varied"][key], bool) and isinstance(r.get(key), bool)
        }
        for asked, ran in sorted(asked_ran):
            if asked != ran:
                notes.append(
                    f"\n{key}={asked!r} ran as {key}={ran!r} here (what this device takes): its "
                    f"rows ran the same {key} as the {key}={ran!r} rows"
                )
    return notes

"""`python -m workbench bench`: the offline throughput benchmark.

256 requests of random token ids (below 10,000), prompt and output lengths uniform in [100, 1024],
seed 0, temperature 0.6, EOS ignored; one warm-up generate on other prompts, then one timed
generate. Prints output tokens, seconds, output tokens/s, the roofline bound for the workload and
the median decode step time at the largest batch against its bound. `--json` prints one object.

`--sweep KEY=V1,V2` (repeatable) runs every combination in one process, on the same workload, and
ends with a table: e.g. `--sweep overlap=True,False --sweep cuda_graph=True,False`, or
`--sweep record=off,light,full` for what recording costs. KEY is an option of this command (with
underscores) or any EngineConfig field.
"""

from __future__ import annotations

import argparse
import ast
import gc
import itertools
import json
import re
import statistics
import time
from pathlib import Path

import torch

from ..config import CACHE_KINDS, POLICIES
from ..core import SamplingParams
from ..llm import LLM
from .online import latency_summary, poisson_arrivals, serve
from .roofline import DEVICES, decode_step_bound, workload_bound
from .workload import random_workload


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench's flags. Where vLLM's or SGLang's benchmarks have a name for a setting, that
    name works too (`--num-prompts`, `--random-input-len`, `--chunked-prefill-size`, ...)."""
    gpu = torch.cuda.is_available()
    here = "this machine has a GPU" if gpu else "this machine has no GPU"
    p.add_argument(
        "--model",
        default="dummy:qwen3-0.6b" if gpu else "tiny-qwen3",
        help=f"model name or path (dummy:qwen3-0.6b on a GPU, tiny-qwen3 on a CPU; {here})",
    )
    p.add_argument(
        "--num-requests",
        "--num-prompts",
        dest="num_requests",
        type=int,
        default=256 if gpu else 16,
        help="requests in the workload (256 on a GPU, 16 on a CPU)",
    )
    lens = "%s lengths, uniform in [MIN, MAX] ([100, 1024] on a GPU, %s on a CPU)"
    p.add_argument(
        "--input-len",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=[100, 1024] if gpu else [16, 128],
        help=lens % ("prompt", "[16, 128]"),
    )
    p.add_argument(
        "--output-len",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=[100, 1024] if gpu else [16, 64],
        help=lens % ("output", "[16, 64]"),
    )
    ratio = "with --random-range-ratio R, uniform in [N(1 - R), N(1 + R)] as vLLM does"
    p.add_argument("--random-input-len", type=int, metavar="N", help=f"prompt length N ({ratio})")
    p.add_argument("--random-output-len", type=int, metavar="N", help=f"output length N ({ratio})")
    p.add_argument("--random-range-ratio", type=float, default=0.0, metavar="R", help="see above")
    p.add_argument("--seed", type=int, default=0, help="workload and sampling seed")
    p.add_argument("--temperature", type=float, default=0.6, help="sampling temperature")
    p.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="requests/s arriving as a Poisson process (default: all at once); adds latencies",
    )
    add_schedule_arguments(p, max_extend_tokens=8192, max_running_reqs=256)
    p.add_argument(
        "--disable-radix-cache", dest="cache", action="store_const", const="naive",
        help="the same as --cache naive",
    )  # fmt: skip
    _on_off(p, "overlap", None, "overlap scheduling (default: on with CUDA, off on a CPU)",
            also="--disable-overlap-schedule")  # fmt: skip
    _on_off(p, "cuda-graph", True, "CUDA graphs for decode batches (default: on)",
            also="--disable-cuda-graph")  # fmt: skip
    p.add_argument(
        "--fused-kernels",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="FlashInfer's fused norm, rope and SiLU kernels (default: where installed)",
    )
    p.add_argument(
        "--record", default="off", choices=["off", "light", "full"], help="step records kept"
    )
    p.add_argument(
        "--device-spec", default="h200", choices=sorted(DEVICES), help="for the roofline"
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other EngineConfig field, e.g. --option fused_sampling=True (repeatable)",
    )
    p.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="run every combination of these values and print a table (repeatable)",
    )
    p.add_argument(
        "--save",
        metavar="DIR",
        help="write each run's history to DIR/<settings>.json (needs --record light or full); "
        "compare them with workbench.viz.compare_table(load_run(...) ...)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--output-file", metavar="FILE", help="also write the results as JSON to FILE")
    p.add_argument(
        "--profile", action="store_true", help="also profile 10 decode steps at the largest batch"
    )
    p.add_argument("--profile-trace", metavar="FILE", help="with --profile: Chrome trace JSON")


def add_schedule_arguments(
    p: argparse.ArgumentParser, max_extend_tokens: int, max_running_reqs: int
) -> None:
    """The flags `demo` and `bench` share: policy, token budget, request slots, pages, cache;
    under our names and under SGLang's."""
    p.add_argument("--policy", default="prefill_first", choices=POLICIES, help="batch policy")
    p.add_argument(
        "--max-extend-tokens",
        "--chunked-prefill-size",
        dest="max_extend_tokens",
        type=int,
        default=max_extend_tokens,
        help="the token budget of a batch: the prefill chunk size",
    )
    p.add_argument(
        "--max-running-reqs",
        "--max-running-requests",
        dest="max_running_reqs",
        type=int,
        default=max_running_reqs,
        help="request slots",
    )
    p.add_argument("--page-size", type=int, default=1, help="tokens per KV page (16 is faster)")
    p.add_argument("--cache", default="radix", choices=CACHE_KINDS, help="prefix cache")


def _on_off(p: argparse.ArgumentParser, name: str, default, text: str, also: str) -> None:
    """`--name` / `--no-name`, and `also` (SGLang's `--disable-...`) for `--no-name`."""
    p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=default, help=text)
    p.add_argument(
        also, dest=name.replace("-", "_"), action="store_false", help=f"the same as --no-{name}"
    )


def resolve_lengths(args: argparse.Namespace) -> None:
    """`--random-input-len N` / `--random-output-len N` (with `--random-range-ratio R`) become
    the ranges `--input-len` / `--output-len` give directly."""
    r = args.random_range_ratio
    if not 0.0 <= r < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {r}")
    for name in ("input", "output"):
        n = getattr(args, f"random_{name}_len")
        if n is not None:
            setattr(args, f"{name}_len", [max(1, round(n * (1 - r))), max(1, round(n * (1 + r)))])


def run_bench(args: argparse.Namespace) -> dict:
    _check_save(args)
    llm = LLM(
        args.model,
        page_size=args.page_size,
        max_extend_tokens=args.max_extend_tokens,
        max_running_reqs=args.max_running_reqs,
        cache=args.cache,
        overlap=args.overlap,
        cuda_graph=args.cuda_graph,
        fused_kernels=args.fused_kernels,
        record=args.record,
        **{"policy": args.policy, **_options(args.option)},
    )
    engine = llm.engine
    work = random_workload(args.num_requests, args.input_len, args.output_len, args.seed)
    params = [
        SamplingParams(max_tokens=n, temperature=args.temperature, ignore_eos=True)
        for n in work.output_lens
    ]
    warm = random_workload(min(32, args.num_requests), args.input_len, (8, 16), args.seed + 1)
    llm.generate(warm.prompts, SamplingParams(max_tokens=16, temperature=args.temperature))
    llm.scheduler.abort_all()  # the timed run starts at step 0 with an empty cache and history

    steps: list[tuple] = []  # (time, phase, batch size, KV tokens read, (launch, wait, collect ms))

    def on_step(outcome) -> None:
        kv = sum(r.device_len for r in outcome.rows)
        host = (outcome.launched.launch_ms, outcome.wait_ms, outcome.collect_ms)
        steps.append((time.perf_counter(), outcome.batch.phase, len(outcome.rows), kv, host))

    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    gc.collect()
    collections = _GcWatch()
    sync()
    start = time.perf_counter()
    latency = {}
    if args.request_rate is None:
        outputs = llm.generate(work.prompts, params, on_step=on_step)
        tokens = sum(o["completion_tokens"] for o in outputs)
    else:
        arrivals = poisson_arrivals(len(work.prompts), args.request_rate, args.seed)
        timings = serve(llm, work.prompts, params, arrivals, on_step=on_step)
        tokens = sum(t.output_tokens for t in timings)
        latency = latency_summary(timings)
    sync()
    seconds = time.perf_counter() - start
    collections.stop()
    llm.check_integrity()

    saved = save_run(llm, args) if args.save else None
    profile = profile_decode(llm, args) if args.profile else None
    spec = DEVICES[args.device_spec]
    bound = workload_bound(engine.model_config, work.prompt_lens, work.output_lens, spec)
    # decode step time at the largest batch: gaps between consecutive decode steps of that size
    top = max((s[2] for s in steps if s[1] == "decode"), default=0)
    gaps = [
        (b[0] - a[0], b[3])
        for a, b in zip(steps, steps[1:])
        if a[1] == b[1] == "decode" and a[2] == b[2] == top
    ]
    step_ms = statistics.median(g for g, _ in gaps) * 1e3 if gaps else float("nan")
    at_top = [s[4] for s in steps if s[1] == "decode" and s[2] == top]
    host = [statistics.median(h[i] for h in at_top) if at_top else float("nan") for i in range(3)]
    step_kv = int(statistics.median(kv for _, kv in gaps)) if gaps else 0
    by_phase, by_batch = split_time(steps, start)
    step_bound_ms = decode_step_bound(engine.model_config, top, step_kv, spec) * 1e3 if gaps else 0
    return dict(
        model=args.model,
        device=torch.cuda.get_device_name() if engine.device.type == "cuda" else "cpu",
        dtype=str(engine.dtype).removeprefix("torch."),
        overlap=llm.scheduler.overlap,
        cuda_graph=engine.config.cuda_graph_enabled,
        fused_kernels=engine.config.fused_kernels_enabled,
        fused_sampling=engine.config.fused_sampling_enabled,
        fused_rope=engine.config.fused_rope_enabled,
        page_size=args.page_size,
        max_extend_tokens=args.max_extend_tokens,
        max_running_reqs=args.max_running_reqs,
        cache=args.cache,
        policy=engine.config.policy,
        record=args.record,
        num_requests=args.num_requests,
        input_len=args.input_len,
        output_len=args.output_len,
        output_tokens=tokens,
        seconds=round(seconds, 3),
        output_tokens_per_s=round(tokens / seconds, 1),
        steps=len(steps),
        roofline_tokens_per_s=round(bound.tokens_per_second, 1),
        roofline_fraction=round(bound.seconds / seconds, 3),
        phase_seconds={p: round(sum(v), 3) for p, v in by_phase.items()},
        phase_steps={p: len(v) for p, v in by_phase.items()},
        decode_by_batch={k: (len(v), round(sum(v), 3)) for k, v in by_batch.items()},
        gc_collections=collections.count,
        gc_full_collections=collections.full,
        gc_seconds=round(collections.seconds, 3),
        decode_batch=top,
        decode_step_ms=round(step_ms, 3),
        decode_step_kv_tokens=step_kv,
        decode_step_bound_ms=round(step_bound_ms, 3),
        decode_launch_ms=round(host[0], 3),
        decode_wait_ms=round(host[1], 3),
        decode_collect_ms=round(host[2], 3),
        request_rate=args.request_rate,
        **latency,
        **({"saved": str(saved)} if saved else {}),
        **({"profile": profile} if profile else {}),
    )


BATCH_BUCKETS = (16, 64, 128, 192)


def split_time(steps: list[tuple], start: float) -> tuple[dict, dict]:
    """Seconds between consecutive step ends, by the later step's phase; and decode seconds by
    batch size (where the time goes as requests finish)."""
    by_phase: dict[str, list[float]] = {}
    by_batch: dict[str, list[float]] = {}
    for prev_t, (t, phase, size, *_) in zip([start] + [s[0] for s in steps], steps):
        by_phase.setdefault(phase, []).append(t - prev_t)
        if phase == "decode":
            top = f">{BATCH_BUCKETS[-1]}"
            label = next((f"<={b}" for b in BATCH_BUCKETS if size <= b), top)
            by_batch.setdefault(label, []).append(t - prev_t)
    return by_phase, by_batch


class _GcWatch:
    """Counts the garbage collector's passes (and their time) until stop()."""

    def __init__(self) -> None:
        self.count, self.full, self.seconds, self._t = 0, 0, 0.0, 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.count += 1
            self.full += info["generation"] == 2
            self.seconds += time.perf_counter() - self._t

    def stop(self) -> None:
        gc.callbacks.remove(self._on_gc)


def _check_save(args: argparse.Namespace) -> None:
    if args.save and args.record == "off":
        raise ValueError("--save writes the run's history: it needs --record light or full")


def save_run(llm: LLM, args: argparse.Namespace) -> Path:
    """The timed run's history as a saved run, named after the settings a sweep varied."""
    varied = getattr(args, "varied", {})  # absent outside a sweep
    name = "_".join(f"{k}={v}" for k, v in varied.items()) or "run"
    name = re.sub(r"[^A-Za-z0-9=._-]+", "-", name)
    return llm.scheduler.history.save(Path(args.save) / f"{name}.json", llm.run_meta())


def _options(pairs: list[str]) -> dict:
    options = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        options[key] = _value(value)
    return options


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def sweep_configs(args: argparse.Namespace) -> list[argparse.Namespace]:
    """One namespace per combination of the `--sweep` values (the arguments alone if none);
    each names the settings it varied in `varied`."""
    axes = []
    for spec in args.sweep:
        key, sep, values = spec.partition("=")
        if not sep or not values:
            raise ValueError(f"--sweep wants KEY=V1,V2,..., got {spec!r}")
        key = key.replace("-", "_")
        axes.append([(key, _value(v)) for v in values.split(",")])
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


def run_sweep(args: argparse.Namespace) -> list[dict]:
    """Run every configuration in turn, freeing each engine before the next is built."""
    configs = sweep_configs(args)
    for run in configs:
        _check_save(run)
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
    return "\n".join(lines)


def profile_decode(llm: LLM, args: argparse.Namespace) -> str:
    """torch.profiler over 10 decode steps of a full batch: where the time goes, CPU and GPU."""
    from torch.profiler import ProfilerActivity, profile

    work = random_workload(args.max_running_reqs, (500, 600), (40, 40), args.seed + 2)
    sp = SamplingParams(max_tokens=40, temperature=args.temperature, ignore_eos=True)
    llm.add_requests(work.prompts, sp)
    sched = llm.scheduler
    while sched.prefill.queue:
        sched.step()
    for _ in range(5):
        sched.step()
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if llm.engine.device.type == "cuda" else []
    )
    with profile(activities=activities) as prof:
        for _ in range(10):
            sched.step()
        torch.cuda.synchronize() if llm.engine.device.type == "cuda" else None
    while sched.step() is not None:
        pass
    sched.finished.clear()
    sort = "self_cuda_time_total" if llm.engine.device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=25)
    cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    if args.profile_trace:
        prof.export_chrome_trace(args.profile_trace)
    cuda = llm.engine.device.type == "cuda"
    return "\n".join([table, cpu] + ([device_gaps(prof, steps=10)] if cuda else []))


def device_gaps(prof, steps: int) -> str:
    """How busy the device was over the profiled steps, and where it sat idle."""
    from torch.autograd import DeviceType

    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    )
    if not spans:
        return "no device activity recorded"
    busy, gaps, end, prev = 0.0, [], spans[0][0], spans[0][2]
    for start, stop, name in spans:
        if start > end:
            gaps.append((start - end, prev, name))
        if stop > end:
            busy += stop - max(start, end)
            end, prev = stop, name
    span = end - spans[0][0]
    idle = sum(g for g, _, _ in gaps)
    large = sorted(gaps, reverse=True)[:5]
    lines = [
        f"device busy {busy / span:.1%} of {span / 1e3:.2f} ms over {steps} steps; idle "
        f"{idle / steps / 1e3:.3f} ms per step in {len(gaps)} gaps "
        f"({sum(g > 20 for g, _, _ in gaps)} over 20 us)",
        *(f"  gap {g:8.1f} us after {a[:60]!r} before {b[:60]!r}" for g, a, b in large),
    ]
    return "\n".join(lines)


def print_result(r: dict) -> None:
    print(
        f"workbench bench: {r['model']} on {r['device']} ({r['dtype']}), overlap "
        f"{'on' if r['overlap'] else 'off'}, cuda graphs {'on' if r['cuda_graph'] else 'off'}, "
        f"fused kernels {'on' if r['fused_kernels'] else 'off'}, "
        f"fused rope {'on' if r['fused_rope'] else 'off'}, "
        f"fused sampling {'on' if r['fused_sampling'] else 'off'}, "
        f"page size {r['page_size']}, chunk {r['max_extend_tokens']}, policy {r['policy']}, "
        f"record {r['record']}"
    )
    print(
        f"requests {r['num_requests']}, input {r['input_len'][0]}-{r['input_len'][1]}, "
        f"output {r['output_len'][0]}-{r['output_len'][1]}, {r['steps']} steps"
    )
    print(
        f"output tokens {r['output_tokens']} | seconds {r['seconds']:.2f} | "
        f"output tokens/s {r['output_tokens_per_s']:,.0f}"
    )
    phases = ", ".join(
        f"{p} {r['phase_steps'][p]} steps {t:.2f} s" for p, t in r["phase_seconds"].items()
    )
    print(f"time by phase: {phases}")
    buckets = ", ".join(f"{k} {n} steps {t:.2f} s" for k, (n, t) in r["decode_by_batch"].items())
    print(f"decode by batch size: {buckets}; garbage collections during the run: "
          f"{r['gc_collections']}, {r['gc_full_collections']} of them full, "
          f"{r['gc_seconds']:.2f} s")  # fmt: skip
    step = (
        f"decode step at batch {r['decode_batch']} ({r['decode_step_kv_tokens']} KV tokens): "
        f"{r['decode_step_ms']:.2f} ms"
    )
    if r["device"] == "cpu":  # the roofline models a GPU (--device-spec)
        print(f"{step} (no roofline on the cpu)")
    else:
        print(
            f"roofline bound {r['roofline_tokens_per_s']:,.0f} tokens/s: achieved "
            f"{r['roofline_fraction']:.0%}; {step}, bound {r['decode_step_bound_ms']:.2f} ms"
        )
    print(
        f"host per decode step at batch {r['decode_batch']}: launch "
        f"{r['decode_launch_ms']:.2f} ms, waiting for the device {r['decode_wait_ms']:.2f} ms, "
        f"collect {r['decode_collect_ms']:.2f} ms"
    )
    if "ttft_ms_p50" in r:
        nan = float("nan")
        print(
            f"request rate {r['request_rate']}/s: TTFT p50 {r['ttft_ms_p50']:.1f} ms, "
            f"p90 {r['ttft_ms_p90']:.1f} ms, p99 {r['ttft_ms_p99']:.1f} ms | TPOT p50 "
            f"{r.get('tpot_ms_p50', nan):.2f} ms, p90 {r.get('tpot_ms_p90', nan):.2f} ms"
        )
    if "saved" in r:
        print(f"history saved to {r['saved']}")


def main(args: argparse.Namespace) -> None:
    resolve_lengths(args)
    if args.sweep:
        results = run_sweep(args)
        _write(args, results)
        print(json.dumps(results) if args.json else sweep_table(results))
        return
    result = run_bench(args)
    _write(args, {k: v for k, v in result.items() if k != "profile"})
    if args.profile:
        print(result.pop("profile"))
    print(json.dumps(result) if args.json else "", end="\n" if args.json else "")
    if not args.json:
        print_result(result)


def _write(args: argparse.Namespace, results) -> None:
    if args.output_file:
        Path(args.output_file).write_text(json.dumps(results, indent=1) + "\n")

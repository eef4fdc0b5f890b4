"""One benchmark result as the lines `python -m workbench bench` prints (without `--json`)."""

from __future__ import annotations

import math

from ..history.roofline import DEVICES
from .dataset import reuse_line, trace_line
from .goodput import print_slo


def print_result(r: dict) -> None:
    """The settings, the throughput, where the time went, the decode step and the latencies."""
    print(_settings_line(r))
    if "trace" in r:
        print(trace_line(r["trace"]))
    print(
        f"requests {r['num_requests']}, input {r['input_len'][0]}-{r['input_len'][1]}, "
        f"output {r['output_len'][0]}-{r['output_len'][1]}, {r['steps']} steps"
    )
    idle = r.get("idle_seconds") or 0.0
    waited = (
        f" (the arrivals' rate, not the engine's: it waited for them {idle / r['seconds']:.0%} "
        "of the run)"
        if idle > 0.5 * r["seconds"]
        else ""
    )
    print(
        f"output tokens {r['output_tokens']} | seconds {r['seconds']:.2f} | "
        f"output tokens/s {r['output_tokens_per_s']:,.0f}{waited}"
    )
    if r.get("events_read_seconds") is not None:
        print(f"profiler events read after the run in {r['events_read_seconds']:.2f} s")
    if r.get("profiled_steps") is not None:
        print(f"profiled {r['profiled_steps']} of {r['steps']} steps ({r['profile_steps']})")
    _print_time_split(r)
    _print_decode_step(r)
    if "prefix_reuse" in r:
        print(reuse_line(r["prefix_reuse"]))
    if "ttft_ms_p50" in r:
        nan = float("nan")
        rate = r["request_rate"]
        arriving = f"request rate {rate}/s" if rate is not None else "at the trace's times"
        print(
            f"{arriving}: TTFT p50 {r['ttft_ms_p50']:.1f} ms, "
            f"p90 {r['ttft_ms_p90']:.1f} ms, p99 {r['ttft_ms_p99']:.1f} ms | TPOT p50 "
            f"{r.get('tpot_ms_p50', nan):.2f} ms, p90 {r.get('tpot_ms_p90', nan):.2f} ms | "
            f"end to end p50 {r.get('e2e_ms_p50', nan):.1f} ms, p90 {r.get('e2e_ms_p90', nan):.1f} "
            f"ms, p99 {r.get('e2e_ms_p99', nan):.1f} ms"
        )
    if "slo" in r:
        print_slo(r["slo"])
    if "saved" in r:
        print(f"history saved to {r['saved']}")
    if "profile_trace" in r:
        print(f"Chrome trace of the run written to {r['profile_trace']} (open it in Perfetto)")


def _settings_line(r: dict) -> str:
    def on(key: str) -> str:
        return "on" if r[key] else "off"

    return (
        f"workbench bench: {r['model']} on {r['device']} ({r['dtype']})"
        + (
            f" x {r['tp_size']} (tensor parallel, {r.get('tp_backend', 'nccl')})"
            if r.get("tp_size", 1) > 1
            else ""
        )
        + f", overlap {on('overlap')}, cuda graphs {on('cuda_graph')}, "
        + kernels_said(r.get("kernels"))
        + ", "
        + f"page size {r['page_size']}, chunk {r['max_extend_tokens']}, policy {r['policy']}, "
        f"record {r['record']}"
    )


def kernels_said(k: dict | None) -> str:
    """`Engine.kernels` in words (a twin's costs from older runs: None)."""
    if k is None:
        return "kernels not recorded by its runs"

    def on(key: str) -> str:
        return "on" if k[key] else "off"

    cores = k.get("decode_cores")
    split = {True: ", KV split", False: ", no KV split"}.get(k.get("decode_split_kv"), "")
    return (
        f"fused kernels {on('fused_kernels')}, fused rope {on('fused_rope')}, "
        f"fused sampling {on('fused_sampling')}, small-batch GEMM {on('small_gemm')}, "
        f"decode attention {k['decode_attention']}"
        + (f" ({cores}{split})" if cores else "")
        + f", PDL {on('pdl')}"
        + (f", MoE experts {k['moe_backend']}" if k.get("moe_backend") else "")
    )


def _print_time_split(r: dict) -> None:
    phases = ", ".join(
        f"{p} {_steps(r['phase_steps'][p])} {t:.2f} s" for p, t in r["phase_seconds"].items()
    )
    idle = r.get("idle_seconds") or 0.0
    waiting = f"; waiting for requests to arrive {idle:.2f} s" if idle else ""
    print(f"time by phase: {phases}{waiting}")
    buckets = ", ".join(f"{k} {_steps(n)} {t:.2f} s" for k, (n, t) in r["decode_by_batch"].items())
    print(
        f"decode by batch size: {buckets}; garbage collections during the run: "
        f"{r['gc_collections']}, {r['gc_full_collections']} of them full, "
        f"{r['gc_seconds']:.2f} s"
    )


def _print_decode_step(r: dict) -> None:
    measured = not math.isnan(r["decode_step_ms"])  # NaN: no two decode steps of its size ran
    if measured:
        step = (
            f"decode step at batch {r['decode_batch']} ({r['decode_step_kv_tokens']} KV tokens): "
            f"{r['decode_step_ms']:.2f} ms"
        )
    else:  # a step's time is from one decode step of its size to the next
        step = (
            f"decode step at batch {r['decode_batch']}: no time measured (it is the time from one "
            "decode step of that size to the next, and no two ran one after the other)"
        )
    if r["roofline_tokens_per_s"] is None:  # the roofline models a GPU's run (--device-spec)
        if r["device"] == "cpu":
            why = "on the cpu"
        elif r["device"].startswith("a twin"):
            why = "for a twin"
        else:
            why = f"for a GPU of no known spec: give --device-spec {' or '.join(DEVICES)}"
        print(f"{step} (no roofline {why})")
    else:
        touched = r.get("decode_step_experts_touched")
        reads = "" if touched is None else f" (reading the {touched:g} experts a layer routed to)"
        bound = f", bound {r['decode_step_bound_ms']:.2f} ms{reads}" if measured else ""
        print(
            f"roofline bound ({r['roofline_device']}) "
            f"{r['roofline_tokens_per_s']:,.0f} tokens/s: achieved "
            f"{r['roofline_fraction']:.0%}; {step}{bound}"
        )
    print(
        f"host per decode step at batch {r['decode_batch']}: launch "
        f"{r['decode_launch_ms']:.2f} ms, waiting for the device {r['decode_wait_ms']:.2f} ms, "
        f"collect {r['decode_collect_ms']:.2f} ms"
    )
    if r.get("prompt_steps"):
        forward, device = r["prompt_step_forward_ms"], r["prompt_step_device_ms"]
        if r["device"] == "cpu":
            why = " (on the CPU the forward stage computes the layers)"
        elif forward >= 0.8 * device:  # the device timer spans the launching
            # NOTE: a wait on the GPU inside the forward looks the same from the host, so no
            # verdict (dummy Qwen3-30B-A3B's 16,384-token steps on an H200: 289 ms both, once
            # said to be the launching's; which it was has not been measured)
            why = (
                ": the host's forward stage lasted as long as the GPU's work (launching the "
                "layers one by one, or the forward waiting on the GPU; "
                "--profile-when \"phase != 'decode'\" shows which)"
            )
        else:
            why = ""
        graphs = r.get("prompt_step_graphs", 0)
        replayed = f" ({graphs} replayed a CUDA graph)" if graphs else ""
        print(
            f"steps with prompt tokens: {r['prompt_steps']}{replayed}, median "
            f"{r['prompt_step_tokens']:,.0f} tokens, host forward stage {forward:.2f} ms, device "
            f"{device:.2f} ms{why}"
        )


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"

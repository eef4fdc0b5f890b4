"""The flags vLLM's and SGLang's users type: each is accepted with its meaning, or refused with
a message that names our equivalent; errors print the command's own usage."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading

import pytest

from workbench.bench.cli import add_arguments, resolve_lengths
from workbench.flags import llm_options


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="workbench bench")
    add_arguments(parser)
    args = parser.parse_args(argv)
    resolve_lengths(args)
    return args


@pytest.mark.parametrize(
    "flag, value, field, expected",
    [
        ("--max-num-seqs", "12", "max_running_reqs", 12),  # vLLM
        ("--max-running-requests", "12", "max_running_reqs", 12),  # SGLang
        ("--max-num-batched-tokens", "384", "max_extend_tokens", 384),  # vLLM
        ("--chunked-prefill-size", "384", "max_extend_tokens", 384),  # SGLang
        ("--tensor-parallel-size", "2", "tp_size", 2),  # vLLM
        ("--block-size", "16", "page_size", 16),  # vLLM
        ("--model-path", "tiny-llama", "model", "tiny-llama"),  # SGLang
        ("--output-json", "out.json", "output_file", "out.json"),  # vLLM
        ("--result-filename", "out.json", "output_file", "out.json"),  # SGLang
        ("--dataset-name", "random", "dataset_name", "random"),
        ("--num-prompts", "7", "num_requests", 7),
        ("--input-len", "128", "input_len", [128, 128]),  # vLLM: one length for all
        ("--output-len", "32", "output_len", [32, 32]),
        ("--input-len", "64 256", "input_len", [64, 256]),  # ours: a range
        ("--random-input-len", "100", "input_len", [100, 100]),
        ("--tp", "2", "tp_size", 2),  # SGLang
        ("--max-model-len", "512", "max_seq_len", 512),  # vLLM
        ("--context-length", "512", "max_seq_len", 512),  # SGLang
        ("--dtype", "half", "dtype", "float16"),  # vLLM's names
        ("--dtype", "float", "dtype", "float32"),
        ("--dtype", "auto", "dtype", None),  # the engine's choice
    ],
)
def test_a_vllm_or_sglang_flag_means_what_it_means_there(flag, value, field, expected):
    assert getattr(parse(flag, *value.split()), field) == expected


def test_flags_without_a_value_are_accepted():
    assert parse("--enable-chunked-prefill").enable_chunked_prefill
    assert parse("--disable-radix-cache").cache == "naive"
    assert parse("--disable-overlap-schedule").overlap is False
    assert parse("--disable-cuda-graph").cuda_graph is False
    assert parse("--enforce-eager").cuda_graph is False  # vLLM's
    assert parse("--no-enable-prefix-caching").cache == "naive"
    assert parse("--enable-prefix-caching").cache == "radix"
    options = llm_options(parse("--max-model-len", "300", "--dtype", "bf16", "--enforce-eager"))
    assert options["max_seq_len"] == 300 and options["dtype"] == "bf16"
    assert not options["cuda_graph"]


def test_an_unknown_dataset_is_refused_naming_what_is_built_in(capsys):
    with pytest.raises(SystemExit):
        parse("--dataset-name", "sharegpt")
    err = capsys.readouterr().err
    assert "'random'" in err and "azure-conv, azure-code, mooncake, mooncake-synthetic" in err


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="--input-len takes N or MIN MAX"):
        parse("--input-len", "9", "3")
    with pytest.raises(ValueError, match="--output-len takes N or MIN MAX"):
        parse("--output-len", "1", "2", "3")


@pytest.mark.slow  # a whole bench in a subprocess (~13 s); test_bench.py's covers the names
def test_a_run_under_vllm_names_and_errors_in_the_bench_usage(tmp_path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "workbench", "bench", "--model-path", "tiny-qwen3"]
    flags = (
        ["--num-prompts", "4", "--input-len", "24", "--output-len", "6", "--max-num-seqs", "2"]
        + ["--max-num-batched-tokens", "16", "--block-size", "4", "--enable-chunked-prefill"]
        + ["--output-json", str(out)]
    )
    subprocess.run(cmd + flags, check=True, capture_output=True, text=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["max_running_reqs"] == 2 and result["page_size"] == 4
    assert result["max_extend_tokens"] == 16 and result["output_tokens"] == 24
    assert result["roofline_tokens_per_s"] is None  # the text says so too: no roofline on a CPU
    bad = subprocess.run(cmd + ["--max-num-seqs", "2", "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "workbench bench: error: unrecognized arguments: --bogus" in bad.stderr
    assert bad.stderr.startswith("usage: workbench bench")
    # a value the engine's checks refuse: its message after the flag's names, with no traceback
    bad = subprocess.run(cmd + ["--max-extend-tokens", "-3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    expected = (
        "workbench bench: error: argument --max-extend-tokens/--chunked-prefill-size/"
        "--max-num-batched-tokens: max_extend_tokens must be an integer >= 1, got -3"
    )
    assert bad.stderr.strip().splitlines()[-1] == expected


def test_ctrl_c_in_a_run_waiting_for_its_requests_ends_it_without_a_traceback():
    """A rate far lower than meant says how long the run would wait; Ctrl-C then ends it as a
    shell expects (status 130), not with a KeyboardInterrupt traceback."""
    cmd = [sys.executable, "-m", "workbench", "bench", "--model", "tiny-llama"]
    cmd += ["--num-prompts", "2", "--request-rate", "1e-9"]
    said = "bench: the last of 2 requests arrives "
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(120, run.kill)  # a run that never says it would wait ends anyway
    guard.start()
    try:
        lines = iter(run.stderr.readline, "")
        line = next((x for x in lines if x.startswith(said)), "")  # (after any warning)
        assert line.rstrip().endswith(
            "s after the start at --request-rate 1e-09/s; the run waits for it"
        ), line
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        guard.cancel()
        run.kill()
    assert run.returncode == 130, err
    assert err.strip().endswith("workbench bench: interrupted") and "Traceback" not in err


# each run as from a shell (`main()` reads sys.argv: its errors are said as a bad flag's), in one
# process, so that torch is imported once
SHELL = """
import json, sys
from workbench.__main__ import main
for argv in json.loads(sys.argv[1]):
    sys.argv = ["workbench", *argv]
    try:
        main()
    except SystemExit as exc:
        print(f"exit {exc.code}", file=sys.stderr)
    print("--", file=sys.stderr)
"""


def test_every_command_takes_the_engines_names_and_says_a_bad_option_as_a_bad_flag():
    """`--device` on bench (not taken for --device-spec: no abbreviations), demo under SGLang's
    names, and an `--option` or `--sweep` the engine refuses, said as a bad flag (exit 2, no
    traceback): a wrong type or an unknown keyword as an out-of-range value is."""
    bench = ["bench", "--model", "tiny-fast", "--num-prompts", "2", "--input-len", "8"]
    bench += ["--output-len", "3"]
    args = parse("--device", "cpu")  # its own flag, beside --device-spec
    assert args.device == "cpu" and llm_options(args)["device"] == "cpu"
    demo = ["demo", "--model-path", "tiny-llama", "--disable-radix-cache"]
    bad = [
        # what no run could give, refused before the run (a traceback after it, before)
        (["--output-file", "/nonexistent-dir/out.json"], "--output-file '/nonexistent-dir/out"),
        (["--num-prompts", "0"], "--num-prompts: num_requests must be an integer >= 1, got 0"),
        (["--sweep", "num_requests=0,2"], "--sweep num_requests=0: num_requests must be"),
        (["--step-costs", "/nonexistent.json"], "no step costs file '/nonexistent.json'"),
        (["--fused-kernels"], "fused_kernels=True runs FlashInfer's norm"),
        (["--option", "model=tiny-qwen3"], "--option model=... : model has a flag of its own"),
        (["--option", "foo"], "--option takes KEY=VALUE (e.g. max_seq_len=2048), got 'foo'"),
        (["--option", "max_extend_tokens=abc"], "max_extend_tokens must be an integer >= 1"),
        (["--option", "nonexistent=1"], "LLM has no keyword 'nonexistent'; it takes"),
        (["--sweep", "bogus=1,2"], "LLM has no keyword 'bogus'"),
        (["--dev", "cpu"], "unrecognized arguments: --dev cpu"),
    ]
    # demo's names reach the engine: its check of --max-num-seqs 0 is the error said
    bad.append((["--max-num-seqs", "0"], "max_running_reqs must be an integer in [1, 65536]"))
    runs = [bench + flags for flags, _ in bad[:-1]] + [demo + bad[-1][0]]
    ran = subprocess.run(
        [sys.executable, "-c", SHELL, json.dumps(runs)], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    said = ran.stderr.split("--\n")
    for (_, message), run, err in zip(bad, runs, said, strict=False):
        # (a flag's own check follows its names: "error: argument --num-requests/--num-prompts: ")
        assert f"workbench {run[0]}: error: " in err and message in err, err
        assert err.endswith("exit 2\n"), err


def test_moe_backend_flag_reaches_the_engine():
    from workbench import LLM

    args = parse("--model", "tiny-qwen3-moe", "--moe-backend", "torch")
    assert llm_options(args)["moe_backend"] == "torch"
    llm = LLM(args.model, **llm_options(args))
    assert llm.config.moe_backend == "torch"
    with pytest.raises(SystemExit):
        parse("--moe-backend", "cutlass")


@pytest.mark.slow  # serve processes loading SmolLM2 (~18 s)
def test_serve_on_a_port_in_use_or_a_host_not_here_is_a_bad_flag():
    """Said as a bad flag (exit 2, no traceback), with the advice that fits: another port (the
    flag's spelling) where the port is taken, a host this machine has where the host is not."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        runs = [
            ["serve", "--model", "tiny-fast", "--port", port],
            ["serve", "--model", "tiny-fast", "--host", "999.1.1.1", "--port", "0"],
        ]
        ran = subprocess.run(
            [sys.executable, "-c", SHELL, json.dumps(runs)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert "Traceback" not in ran.stderr, ran.stderr
    in_use, no_host = ran.stderr.split("--\n")[:2]
    assert "workbench serve: error: " in in_use and "--port 0" in in_use and "exit 2" in in_use
    assert "give a host this machine has" in no_host and "exit 2" in no_host, no_host


@pytest.mark.parametrize(
    "command, flags, said",
    [
        # each refused by its flag before any model loads (they were after it, or never)
        ("bench", ["--request-rate", "0"], "--request-rate: request_rate must be a finite number"),
        ("bench", ["--request-rate", "nan"], "> 0 (per second), or inf, got nan"),
        ("bench", ["--temperature", "nan"], "--temperature: temperature must be a finite number"),
        ("bench", ["--random-input-len", "0"], "random_input_len must be an integer >= 1, got 0"),
        ("bench", ["--random-range-ratio", "1"], "random_range_ratio must be a finite number in"),
        ("bench", ["--profile-batches", "abc"], "--profile-batches: batch sizes must be integers"),
        ("bench", ["--tp", "0"], "--tp: tp_size must be an integer in [1, 64], got 0"),
        ("bench", ["--max-model-len", "0"], "max_seq_len must be an integer >= 1, got 0"),
        ("bench", ["--dtype", "half8"], "--dtype: dtype must be auto, float32"),
        ("bench", ["--page-size", "1e3"], "page_size must be an integer in [1, 65536], got '1e3'"),
        ("bench", ["--gpu-memory-utilization", "0.8"], "not a share of the whole GPU here"),
        ("serve", ["--port", "70000"], "--port: port must be an integer in [0, 65535], got 70000"),
        ("serve", ["--max-queued-requests", "0"], "max_queued_requests must be an integer >= 1"),
        ("serve", ["--mem-fraction-static", "0.8"], "--option memory_ratio=R"),
        ("chat", ["--max-tokens", "0"], "--max-tokens: max_tokens must be an integer >= 1, got 0"),
        (
            "demo",
            ["--max-extend-tokens", "x"],
            "max_extend_tokens must be an integer >= 1, got 'x'",
        ),
    ],
)
def test_a_bad_flag_value_is_refused_by_its_flag_before_a_model_loads(command, flags, said, capsys):
    from workbench.__main__ import main

    # a model that does not exist: had the value passed, loading it would have failed instead
    with pytest.raises(SystemExit) as exited:
        main([command, "--model", "no-such-model", *flags])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"workbench {command}: error: " in err and said in err, err


# a flag the run would have ignored, and what refusing it says
IGNORED = [
    (["--profile-batches", "8"], "--profile-batches does nothing without --profile"),
    (["--profile-python"], "--profile-python does nothing without --profile"),
    (["--max-profiled-steps", "3"], "--max-profiled-steps does nothing without --record full"),
    (["--profile-trace", "t.json"], "--profile-trace does nothing without --profile, --record"),
    (["--dataset-name", "mooncake", "--input-len", "8"], "--input-len: the trace's requests"),
    (["--dataset-name", "azure-conv", "--random-output-len", "4"], "--random-output-len: the"),
    (["--dataset-name", "mooncake", "--dataset-path", "/nonexistent.jsonl"], "no such file"),
    (["--trace-block-size", "16"], "--trace-block-size is a trace's: give its kind too"),
    (["--dataset-path", "x.csv"], "--dataset-path is a trace's: give its kind too"),
    (
        ["--sweep", "page_size=1,2", "--sweep", "page_size=4"],
        "--sweep page_size is given twice",
    ),
    (["--profile-when", "phase == 'mixd'"], "phase is one of ('prefill', 'decode', 'mixed')"),
    (["--sweep", "request_rate=4,0"], "--sweep request_rate=0: request_rate must be a finite"),
]


def test_a_flag_the_run_would_ignore_is_refused_before_it():
    """Each refused before any model loads (the model named does not exist), as a bad flag."""
    runs = [["bench", "--model", "no-such", *flags] for flags, _ in IGNORED]
    shell = [sys.executable, "-c", SHELL, json.dumps(runs)]
    ran = subprocess.run(shell, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in ran.stderr, ran.stderr
    for (_, said), err in zip(IGNORED, ran.stderr.split("--\n"), strict=False):
        assert "workbench bench: error: " in err and said in err, err
        assert err.endswith("exit 2\n"), err


def test_json_with_a_profile_prints_json_alone(capsys):
    """`--json --profile`: stdout is one JSON document, the profile's tables inside it."""
    from workbench.__main__ import main

    flags = ["--model", "tiny-fast", "--num-prompts", "4", "--input-len", "8", "--output-len", "4"]
    main(["bench", *flags, "--profile", "--profile-batches", "2,4", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert [s["batch_size"] for s in result["host_split"]] == [2, 4]
    assert "10 decode steps of 4 requests, profiled" in result["profile"]

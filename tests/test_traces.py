"""Production traces, loaded and replayed: each format from its shipped slice or a file written
here, equal block ids as equal tokens, the prefix cache's hits against a hand computation from
the block ids, the bench's dataset flags, and bad files refused with the file, line and field."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from workbench import SamplingParams, Workbench, traces, viz
from workbench.__main__ import main
from workbench.pool_sweep import pool_sweep
from workbench.traces import TraceRequest

from .test_twin import synthetic_costs

MODEL = "tiny-qwen3"


def expected_cached(trace: traces.Trace, page_size: int = 1) -> list[int]:
    """Each request's cached tokens when the requests run one at a time, every earlier prompt
    still cached: its longest common prefix with an earlier prompt, counted in (block id,
    position in the block) pairs, less its last token (the engine computes at least one), in
    whole pages."""
    b = trace.block_size
    seqs = [
        [(h, p) for k, h in enumerate(r.hash_ids) for p in range(min(b, r.prompt_len - k * b))]
        for r in trace.requests
    ]

    def common(x: list, y: list) -> int:
        return next((n for n, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))

    out = []
    for i, (seq, r) in enumerate(zip(seqs, trace.requests)):
        shared = max((common(seq, seqs[j]) for j in range(i)), default=0)
        out.append(min(shared, r.prompt_len - 1) // page_size * page_size)
    return out


# -- loading ------------------------------------------------------------------------------------


def test_each_shipped_slice_loads_as_its_file_says():
    conv = traces.load("azure-conv")
    assert (conv.format, len(conv), conv.file_requests) == ("azure", 300, 300)
    # 2023-11-16 18:15:46.6805900 then 18:15:50.9951690: to the 100 ns
    assert conv.requests[0] == TraceRequest(0.0, 374, 44, ())
    assert conv.requests[1].arrival_s == pytest.approx(4.314579, abs=1e-9)
    assert sum(conv.prompt_lens) == 270000 and conv.ideal.hit_tokens == 0  # no block ids
    code = traces.load("azure-code")
    assert (code.format, len(code), code.requests[0][1:3]) == ("azure", 300, (4808, 10))
    moon = traces.load("mooncake")
    assert (moon.format, len(moon), moon.duration_s) == ("mooncake", 200, 54.0)
    assert moon.requests[0] == TraceRequest(0.0, 923, 468, (0, 36074))
    # the ideal: 387 of 4235 prompt blocks repeat their whole prefix from an earlier request
    assert (moon.ideal.prompt_blocks, moon.ideal.hit_blocks) == (4235, 387)
    synthetic = traces.load("mooncake-synthetic")
    assert (len(synthetic), synthetic.ideal.hit_blocks, synthetic.ideal.prompt_blocks) == (
        100,
        726,
        3179,
    )
    for trace in (conv, code, moon, synthetic):
        arrivals = trace.arrivals
        assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
        assert min(trace.prompt_lens) >= 1 and min(trace.output_lens) >= 1
        assert trace.summary()["requests"] == len(trace) and repr(trace).startswith("Trace(")


def test_plain_csv_and_json_lines_load_with_their_block_ids(tmp_path):
    rows = [(5.0, 600, 7, [3, 4]), (5.5, 512, 3, [3]), (7.25, 20, 1, [])]
    csv = tmp_path / "t.csv"
    csv.write_text(
        "arrival_s,prompt_len,output_len,hash_ids\n"
        + "".join(f"{t},{p},{o},{' '.join(map(str, h))}\n" for t, p, o, h in rows)
    )
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps(
                dict(arrival_s=t, prompt_len=p, output_len=o, **({"hash_ids": h} if h else {}))
            )
            + "\n"
            for t, p, o, h in rows
        )
    )
    expected = [TraceRequest(t - 5.0, p, o, tuple(h)) for t, p, o, h in rows]
    for path, format in ((csv, "csv"), (jsonl, "jsonl")):
        trace = traces.load(path)  # the format told by the first line
        assert (trace.format, list(trace.requests)) == (format, expected)
        assert traces.load(str(path), format).requests == trace.requests
    # the second request's block is the first's first block: 512 tokens seen before
    assert traces.load(csv).ideal == traces.Reuse(3, 1132, 512, 4, 1)


def test_a_window_a_time_scale_and_a_rate_retime_the_requests():
    whole = traces.load("azure-conv")
    window = traces.load("azure-conv", start=10, duration=20)
    inside = [r for r in whole.requests if 10 <= r.arrival_s < 30]
    assert [r.arrival_s + 10 for r in window.requests] == pytest.approx(
        [r.arrival_s for r in inside]
    )
    assert traces.load("azure-conv", start=10, duration=20, first=5).requests == window.requests[:5]
    slow = traces.load("azure-conv", first=50, time_scale=2.0)
    assert slow.arrivals == pytest.approx([2 * r.arrival_s for r in whole.requests[:50]])
    assert traces.load("mooncake", request_rate=10.0).rate == pytest.approx(10.0)
    assert set(traces.load("mooncake", request_rate=math.inf).arrivals) == {0.0}
    with pytest.raises(ValueError, match="time_scale or request_rate, not both"):
        traces.load("mooncake", time_scale=2.0, request_rate=3.0)
    with pytest.raises(ValueError, match="no request arrives in the window"):
        traces.load("azure-conv", start=1e6)


def test_a_smaller_block_size_scales_every_length_and_keeps_the_blocks():
    full, small = traces.load("mooncake"), traces.load("mooncake", block_size=16)
    assert (small.block_size, small.length_scale) == (16, 16 / 512)
    for r, s in zip(full.requests, small.requests):
        assert s.hash_ids == r.hash_ids
        n = len(s.hash_ids)
        assert (n - 1) * 16 < s.prompt_len <= n * 16  # each block still spanned
        assert abs(s.prompt_len - r.prompt_len / 32) <= 1 and s.output_len >= 1


@pytest.mark.parametrize("long", ["clip", "scale", "drop"])
def test_requests_longer_than_max_len_are_clipped_scaled_or_dropped_and_counted(long):
    whole = traces.load("mooncake")
    too_long = sum(r.prompt_len + r.output_len > 8192 for r in whole.requests)
    trace = traces.load("mooncake", max_len=8192, long=long)
    assert too_long > 0
    assert max(r.prompt_len + r.output_len for r in trace.requests) <= 8192
    for r in trace.requests:
        assert len(r.hash_ids) == -(-r.prompt_len // trace.block_size)
    if long == "clip":
        assert (len(trace), trace.clipped_count, trace.dropped_count) == (200, too_long, 0)
    elif long == "drop":
        assert (len(trace), trace.clipped_count, trace.dropped_count) == (
            200 - too_long,
            0,
            too_long,
        )
    else:  # one factor for every length: the longest request (127k tokens) fits in 8192
        assert len(trace) == 200 and trace.dropped_count == 0 and trace.block_size < 512
        assert trace.length_scale == trace.block_size / 512


# -- prompts ------------------------------------------------------------------------------------


def test_equal_block_ids_are_equal_tokens_and_distinct_ones_differ():
    trace = traces.load("mooncake", block_size=8, first=40)
    requests = trace.to_requests(vocab_size=1000, seed=3)
    blocks: dict[int, list[int]] = {}
    for (ids, sampling, arrival), r in zip(requests, trace.requests):
        assert len(ids) == r.prompt_len and max(ids) < 1000 and arrival == r.arrival_s
        assert (sampling.max_tokens, sampling.ignore_eos) == (r.output_len, True)
        for k, h in enumerate(r.hash_ids):
            block = ids[8 * k : 8 * (k + 1)]
            seen = blocks.setdefault(h, block)
            n = min(len(seen), len(block))  # a partial last block: the start of the whole one
            assert block[:n] == seen[:n]
            if len(block) > len(seen):
                blocks[h] = block
    assert len(blocks) > 100 and 0 in blocks
    whole = [tuple(b) for b in blocks.values() if len(b) == 8]
    assert len(set(whole)) == len(whole)  # distinct ids, distinct blocks
    again = trace.to_requests(vocab_size=1000, seed=3)
    assert [ids for ids, _, _ in again] == [ids for ids, _, _ in requests]
    assert trace.to_requests(1000, seed=4)[0][0] != requests[0][0]
    azure = [ids for ids, _, _ in traces.load("azure-code", first=30).to_requests(5000)]
    assert len({tuple(ids[:16]) for ids in azure}) == 30  # each prompt its own


# -- replaying ----------------------------------------------------------------------------------


@pytest.mark.parametrize("page_size,block_size", [(1, 4), (4, 8)])
def test_one_at_a_time_each_request_finds_its_shared_prefix_in_the_cache(page_size, block_size):
    """An ample pool and one request at a time: every earlier prompt stays cached, so each
    request's cached tokens are its longest prefix of blocks seen before, to the token."""
    trace = traces.load("mooncake-synthetic", block_size=block_size, first=60, time_scale=0.0)
    wb = Workbench(MODEL, page_size=page_size, max_running_reqs=1, record="light")
    uids = wb.add_trace(trace)
    assert uids == sorted(uids) and len(uids) == 60
    wb.run(progress=False)
    wb.check_integrity()
    requests = wb.history.requests
    expected = expected_cached(trace, page_size)
    assert sum(expected) > 500
    assert requests.cached_tokens.tolist() == expected
    assert requests.prompt_tokens.tolist() == trace.prompt_lens
    assert requests.completion_tokens.tolist() == trace.output_lens
    table = traces.prefix_reuse(wb.history, trace)
    run, ideal = table.loc["run"], table.iloc[0]
    assert run.hit_tokens == sum(expected) and run.prompt_tokens == sum(trace.prompt_lens)
    assert run.hit_blocks == sum(c // block_size for c in expected)
    assert (ideal.hit_tokens, ideal.hit_blocks) == (trace.ideal.hit_tokens, trace.ideal.hit_blocks)
    # the ideal counts a prompt seen whole; the engine computes its last token (and whole pages)
    assert 0 <= ideal.hit_tokens - run.hit_tokens <= 60 * page_size
    wb.close()


def test_a_trace_arrives_at_its_times_and_compares_on_the_real_engine_and_the_twin():
    trace = traces.load("mooncake", block_size=4, first=24, time_scale=0.005)
    real = Workbench(MODEL, record="light", max_running_reqs=8)
    settings = {"one at a time": dict(max_running_reqs=1), "eight": dict(max_running_reqs=8)}
    runs = real.compare(settings, requests=trace, progress=False)
    one = runs["one at a time"].requests
    # (a request due while a step runs arrives, and is timed from, the step's end)
    assert (one.arrival_s >= np.asarray(trace.arrivals) - 1e-9).all()
    assert (one.first_scheduled_s >= one.arrival_s - 1e-9).all()
    assert one.cached_tokens.tolist() == expected_cached(trace)
    eight = traces.prefix_reuse(runs["eight"], trace)
    assert eight.loc["run"].hit_tokens <= eight.iloc[0].hit_tokens
    assert eight.loc["run"].prompt_tokens == sum(trace.prompt_lens)
    real.close()

    # the twin: the trace's own times, seconds apart, jumped over on its virtual clock
    trace = traces.load("mooncake", block_size=4, first=24)
    twin = Workbench(MODEL, step_costs=synthetic_costs(MODEL), max_running_reqs=1)
    twin.add_trace(trace, SamplingParams(temperature=0.5))
    twin.run(progress=False)
    requests = twin.history.requests
    late = requests.arrival_s - np.asarray(trace.arrivals)
    assert (late >= -1e-9).all() and (late < 0.05).all()  # virtual seconds: no step is longer
    assert requests.cached_tokens.tolist() == expected_cached(trace)
    assert twin.history.steps.completed_at.max() >= trace.arrivals[-1]


def test_add_trace_checks_every_request_before_queueing_any():
    wb = Workbench(MODEL, max_running_reqs=2, num_pages=256)
    trace = traces.load("mooncake", block_size=8, first=20)  # one prompt needs > 256 slots
    assert max(r.prompt_len + r.output_len for r in trace.requests) > 256
    with pytest.raises(ValueError, match="KV pool"):
        wb.add_trace(trace)
    assert wb.is_done and wb.submitted_count == 0
    with pytest.raises(TypeError, match="Trace"):
        wb.add_trace([(1, 2, 3)])
    wb.close()


# -- the KV pool's size -------------------------------------------------------------------------


def pool_trace() -> traces.Trace:
    """The slice's first 70 requests: every prompt begins with block 0, and request 63 repeats
    the first 48 blocks of request 25's (a conversation's next turn, 18 s later)."""
    return traces.load("mooncake", block_size=4, first=70)


def pool_sizes(trace: traces.Trace) -> tuple[int, int]:
    """The smallest pool that holds the longest request, and one that holds every request."""
    lens = [p + o for p, o in zip(trace.prompt_lens, trace.output_lens)]
    return max(lens), sum(lens)


def test_one_at_a_time_hits_never_fall_as_the_pool_grows_nor_pass_the_ideal():
    """One request at a time, every pool meets the same requests in the same order, and a larger
    least-recently-used cache keeps all that a smaller one keeps: hits never fall as the pool
    grows. The ample pool finds each request's shared prefix to the token (the hand computation);
    the smallest evicts the conversation's first turn before its next one arrives."""
    trace = pool_trace()
    smallest, ample = pool_sizes(trace)
    pools = [ample, smallest, 4 * smallest, 2 * smallest]  # out of order: the runs come sorted
    runs = pool_sweep(trace, pools, MODEL, step_costs=synthetic_costs(MODEL), max_running_reqs=1)
    assert list(runs) == sorted(pools)
    assert [run.meta["num_pages"] for run in runs.values()] == sorted(pools)
    table = traces.pool_reuse(runs, trace)
    assert table.index.name == "num_pages" and table.index.tolist() == sorted(pools)
    assert (table.pool_tokens == table.index).all()  # the costs' pages hold one token
    assert (table.requests == len(trace)).all()
    assert (table.prompt_tokens == sum(trace.prompt_lens)).all()
    assert table.hit_tokens.is_monotonic_increasing and table.hit_blocks.is_monotonic_increasing
    assert table.hit_tokens[ample] == sum(expected_cached(trace))
    assert table.hit_tokens[smallest] < table.hit_tokens[ample]
    ideal = trace.ideal
    assert (table.hit_tokens <= ideal.hit_tokens).all()
    assert (table.hit_blocks <= ideal.hit_blocks).all()
    assert (table.ideal_token_hit_rate == ideal.token_hit_rate).all()
    assert (table.ideal_block_hit_rate == ideal.block_hit_rate).all()
    for n, run in runs.items():  # each row is prefix_reuse's line for its run
        line = traces.prefix_reuse(run, trace).loc["run"]
        for column in ("hit_tokens", "hit_blocks", "token_hit_rate", "block_hit_rate"):
            assert table.loc[n, column] == line[column], (n, column)


def test_the_twins_pool_sweep_caches_what_the_engines_does_and_no_more_than_the_ideal():
    """Eight at a time, arriving at once (no clock in the schedule): on each pool the twin's
    requests find what the real engine's do, request by request, and never more than the ideal
    (how much depends on which requests ran together, so not always more on a larger pool)."""
    trace = traces.load("mooncake", block_size=4, first=70, time_scale=0.0)
    smallest, ample = pool_sizes(trace)
    pools = [smallest, 2 * smallest, ample]
    twin = pool_sweep(trace, pools, MODEL, step_costs=synthetic_costs(MODEL), max_running_reqs=8)
    real = pool_sweep(trace, pools[:2], MODEL, page_size=1, max_running_reqs=8)
    for n in pools[:2]:
        assert twin[n].meta.get("simulated") and not real[n].meta.get("simulated")
        cached = twin[n].requests.cached_tokens.tolist()
        assert cached == real[n].requests.cached_tokens.tolist(), n
    table = traces.pool_reuse(twin, trace)
    assert (table.hit_tokens <= trace.ideal.hit_tokens).all()
    with pytest.raises(ValueError, match=f"runs 'twin' and 'real' both have a pool of {smallest}"):
        traces.pool_reuse({"twin": twin[smallest], "real": real[smallest]}, trace)
    assert (table.hit_blocks <= trace.ideal.hit_blocks).all()
    assert table.hit_tokens[smallest] < table.hit_tokens[ample]


def test_a_pool_sweep_refuses_what_it_cannot_run():
    trace = pool_trace()
    smallest, _ = pool_sizes(trace)
    costs = synthetic_costs(MODEL)
    with pytest.raises(ValueError, match=f"num_pages={smallest - 1}: .*KV pool"):
        pool_sweep(trace, [smallest - 1, smallest], MODEL, step_costs=costs)
    with pytest.raises(ValueError, match="record='off'"):
        pool_sweep(trace, [smallest], MODEL, step_costs=costs, record="off")
    with pytest.raises(ValueError, match="num_pages is empty"):
        pool_sweep(trace, [], MODEL, step_costs=costs)
    with pytest.raises(TypeError, match="pool sizes"):
        pool_sweep(trace, "512", MODEL, step_costs=costs)
    with pytest.raises(ValueError, match="num_pages"):
        pool_sweep(trace, [0], MODEL, step_costs=costs)
    with pytest.raises(TypeError, match="Trace"):
        pool_sweep(trace.requests, [smallest], MODEL, step_costs=costs)
    with pytest.raises(ValueError, match="does not say its KV pool's size"):
        traces.pool_reuse({"a run": object()}, trace)


def test_the_hit_rate_chart_draws_each_pool_and_the_ideal_as_a_rule():
    trace = pool_trace()
    smallest, ample = pool_sizes(trace)
    runs = pool_sweep(trace, [smallest, ample], MODEL, step_costs=synthetic_costs(MODEL))
    table = traces.pool_reuse(runs, trace)
    spec = viz.hit_rate_chart(table).to_dict()
    panels = spec["hconcat"]
    assert [p["title"] for p in panels] == ["in tokens", "in blocks"]
    for panel, measure in zip(panels, ("token", "block")):
        rule, line = panel["layer"]
        assert rule["mark"]["type"] == "rule" and line["mark"]["type"] == "line"
        ideal = spec["datasets"][rule["data"]["name"]]
        assert [row["ideal"] for row in ideal] == [getattr(trace.ideal, f"{measure}_hit_rate")]
        points = spec["datasets"][line["data"]["name"]]
        assert [row["num_pages"] for row in points] == [smallest, ample]
        assert [row["hit_rate"] for row in points] == table[f"{measure}_hit_rate"].tolist()
        assert line["encoding"]["x"]["axis"]["values"] == [smallest, ample]
    with pytest.raises(ValueError, match="pool_reuse's table"):
        viz.hit_rate_chart(traces.prefix_reuse(runs[smallest], trace))


def test_a_sweep_chart_keeps_its_columns_in_the_runs_order_on_a_log_scale_when_asked():
    """Rates named "1x" and "16x" stay in that order (not the strings' "16x" before "1x")."""
    twin = Workbench(MODEL, step_costs=synthetic_costs(MODEL))
    runs = {}
    for rate in (1, 16):
        trace = traces.load("mooncake", block_size=4, first=12, time_scale=1 / rate)
        settings = {f"chunk {c} at {rate}x": dict(max_extend_tokens=c) for c in (16, 64)}
        for name, run in twin.compare(settings, requests=trace, progress=False).items():
            runs[name] = run
            run.meta["rate"] = f"{rate}x"
    spec = viz.sweep_chart(runs, figures=("p95 TTFT (ms)",), column="rate", log=True).to_dict()
    (panel,) = spec["vconcat"]
    assert panel["facet"]["column"]["sort"] == ["1x", "16x"]
    y = panel["spec"]["layer"][0]["encoding"]["y"]
    assert y["scale"]["type"] == "log" and y["title"].endswith("log scale")
    linear = viz.sweep_chart(runs, figures=("p95 TTFT (ms)",), log=False).to_dict()
    assert linear["vconcat"][0]["layer"][0]["encoding"]["y"]["scale"].get("type") is None


# -- the bench ----------------------------------------------------------------------------------


def _bench(tmp_path, capsys, *flags: str) -> tuple[dict, str]:
    out = tmp_path / "result.json"
    main(["bench", "--model", MODEL, "--output-file", str(out), *flags])
    return json.loads(out.read_text()), capsys.readouterr().out


def test_bench_replays_a_mooncake_slice_and_prints_its_hits_beside_the_ideal(tmp_path, capsys):
    flags = ["--dataset-name", "mooncake", "--trace-block-size", "8", "--num-prompts", "12"]
    flags += ["--request-rate", "inf", "--max-running-requests", "1"]
    result, printed = _bench(tmp_path, capsys, *flags)
    trace = traces.load("mooncake", block_size=8, first=12)
    reuse = result["prefix_reuse"]
    assert result["dataset"] == "mooncake" and result["num_requests"] == 12
    assert reuse["run"]["hit_tokens"] == sum(expected_cached(trace)) > 0
    assert reuse["ideal"]["hit_tokens"] == trace.ideal.hit_tokens
    assert reuse["run"]["prompt_tokens"] == sum(trace.prompt_lens)
    line = next(x for x in printed.splitlines() if x.startswith("prefix cache hits:"))
    assert f"{reuse['run']['token_hit_rate']:.1%} of prompt tokens" in line
    assert f"the trace's ideal {trace.ideal.token_hit_rate:.1%} of tokens" in line
    assert "dataset mooncake (mooncake): 12 of 200 requests" in printed

    # the twin (--step-costs): the trace's own arrivals, on its virtual clock
    costs = synthetic_costs(MODEL).save(tmp_path / "costs.json")
    flags = ["--dataset-name", "mooncake", "--trace-block-size", "8", "--num-prompts", "12"]
    result, printed = _bench(tmp_path, capsys, "--step-costs", str(costs), *flags)
    assert result["device"].startswith("a twin of") and result["seconds"] >= trace.duration_s
    assert result["prefix_reuse"]["ideal"] == reuse["ideal"]
    assert "at the trace's times: TTFT" in printed and "prefix cache hits:" in printed
    # the kernels its costs stand for, not the CPU's it runs on (these costs do not say them)
    assert ", kernels not recorded by its runs, " in printed and "fused kernels" not in printed


# -- bad input ----------------------------------------------------------------------------------

GOOD_MOONCAKE = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'
GOOD_AZURE = "2023-11-16 18:15:46.6805900,374,44"


@pytest.mark.parametrize(
    "name,lines,line,field,message",
    [
        ("m.jsonl", [GOOD_MOONCAKE, '{"timestamp": 5, "input_length": 3'], 2, None, "not JSON"),
        ("m.jsonl", [GOOD_MOONCAKE, "[1, 2]"], 2, None, "not a JSON object"),
        (
            "m.jsonl",
            [GOOD_MOONCAKE, GOOD_MOONCAKE.replace('"input_length": 600', '"input_length": -3')],
            2,
            "input_length",
            "at least 1 token, got -3",
        ),
        (
            "m.jsonl",
            [GOOD_MOONCAKE, GOOD_MOONCAKE.replace('"output_length": 5', '"output_length": 0')],
            2,
            "output_length",
            "at least 1 token, got 0",
        ),
        (
            "m.jsonl",
            [GOOD_MOONCAKE.replace("0", "9000", 1), GOOD_MOONCAKE],
            2,
            "timestamp",
            "out of order",
        ),
        ("m.jsonl", [GOOD_MOONCAKE, GOOD_MOONCAKE.replace(", 2]", "]")], 2, "hash_ids", "1 block"),
        ("m.jsonl", [GOOD_MOONCAKE, '{"timestamp": 1, "input_length": 3}'], 2, "output_length", ""),
        (
            "a.csv",
            ["TIMESTAMP,ContextTokens,GeneratedTokens", GOOD_AZURE, "x,1"],
            3,
            None,
            "fields",
        ),
        (
            "a.csv",
            ["TIMESTAMP,ContextTokens,GeneratedTokens", GOOD_AZURE, GOOD_AZURE.replace("374", "0")],
            3,
            "ContextTokens",
            "got 0",
        ),
        (
            "a.csv",
            ["TIMESTAMP,ContextTokens,GeneratedTokens", GOOD_AZURE, "2023-11-16 18:15:40.1,5,5"],
            3,
            "TIMESTAMP",
            "out of order",
        ),
        (
            "a.csv",
            ["TIMESTAMP,ContextTokens,GeneratedTokens", GOOD_AZURE, "yesterday,5,5"],
            3,
            "TIMESTAMP",
            "must be a time",
        ),
        ("p.csv", ["arrival_s,prompt_len,output_len", "0,5,5", "1,5,five"], 3, "output_len", ""),
    ],
)
def test_a_bad_row_is_refused_naming_the_file_line_and_field(
    tmp_path, name, lines, line, field, message
):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    where = f"{path}, line {line}" + (f", field '{field}'" if field else "")
    with pytest.raises(ValueError, match=re.escape(where) + ".*" + re.escape(message)):
        traces.load(path)


def test_an_unknown_format_is_refused(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("when,how long\n1,2\n")
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": cannot tell the trace format"):
        traces.load(path)
    with pytest.raises(ValueError, match="unknown trace format 'parquet'"):
        traces.load("mooncake", "parquet")
    with pytest.raises(ValueError, match="no trace file 'nope.csv', and not a shipped trace"):
        traces.load("nope.csv")
    with pytest.raises(ValueError, match=re.escape(f"{path}, line 1") + ".*lacks"):
        traces.load(path, "azure")
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n\xff\xfe\x00")
    with pytest.raises(ValueError, match=re.escape(f"{binary}, line 3: not UTF-8 text")):
        traces.load(binary)


def test_reuse_refuses_what_is_no_run_or_no_trace():
    trace = traces.load("mooncake", block_size=16, first=4)
    with pytest.raises(TypeError, match="run must be a run of the trace"):
        traces.prefix_reuse(None, trace)
    with pytest.raises(TypeError, match="trace must be a Trace"):
        traces.prefix_reuse(Workbench("tiny-llama", record="light"), "mooncake")


def test_a_trace_of_no_requests_is_refused_where_it_is_made():
    """`load` never makes one (a window with no requests is refused); built by hand, an empty
    trace would fail later where it is shown or replayed, far from the mistake."""
    with pytest.raises(ValueError, match=r"requests: a trace holds at least one request, got \(\)"):
        traces.Trace("empty", "csv", ())

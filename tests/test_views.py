"""Views: charts from a history (live or loaded), the dashboard's widget state, the report."""

from __future__ import annotations

import html
import json
import re
import sys

import pytest

from workbench import SamplingParams, Workbench, load_run, viz
from workbench.viz.causes import describe, run_causes
from workbench.viz.dashboard import Dashboard
from workbench.viz.report import save_png, write_report

from .conftest import PROMPTS, greedy

ALL_CHARTS = (
    "batch_composition",
    "kv_usage",
    "step_times",
    "step_breakdown",
    "admissions",
    "ledger_lines",
)
STEP_CHARTS = ("ledger_bars", "page_table", "kernel_timeline")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    wb = Workbench("tiny-llama", record="full", max_extend_tokens=12, max_running_reqs=3)
    shared = PROMPTS[3]
    for p in [shared, shared + " and more", *PROMPTS[:3]]:
        wb.add_request(p, greedy(6))
    wb.run(progress=False)
    path = wb.save(tmp_path_factory.mktemp("run") / "run.parquet")
    return wb, load_run(path)


def specs(history, step):
    out = {name: getattr(viz, name)(history).to_dict() for name in ALL_CHARTS}
    out |= {name: getattr(viz, name)(history, step).to_dict() for name in STEP_CHARTS}
    return out


def test_a_chart_takes_a_workbench_and_refuses_what_it_cannot_draw(run):
    """A Workbench (or an LLM) stands for its run so far; a step the run did not record, a
    highlight that is no index, and runs that are not a mapping are refused naming them (they
    drew a chart saying "step -1: no batch", or failed in pandas' or Python's words)."""
    wb, saved = run
    assert viz.batch_composition(wb).to_dict() == viz.batch_composition(wb.history).to_dict()
    last = int(saved.steps.step.max())
    for call, error, match in [
        (lambda: viz.page_table(None, 0), TypeError, "history must be a run's history"),
        (lambda: viz.ledger_bars(saved, -1), ValueError, rf"step=-1 is not .* \(steps 0 to {last}"),
        (lambda: viz.page_table(saved, 10**6), ValueError, "step=1000000 is not a recorded step"),
        (lambda: viz.kernel_timeline(saved, "0"), TypeError, "step must be a step's index"),
        (lambda: viz.step_times(saved, highlight_step="x"), TypeError, "highlight_step must be"),
        (lambda: viz.ledger_lines(saved, highlight_uid="a"), TypeError, "highlight_uid must be"),
        (lambda: viz.kernel_timeline(saved, 0, max_events=-5), ValueError, "max_events must be"),
        (lambda: viz.compare_chart({}), ValueError, "runs is empty"),
        (lambda: viz.sweep_chart({}), ValueError, "runs is empty"),
        (lambda: viz.compare_table([saved]), TypeError, "runs must be a mapping of names"),
        (lambda: viz.compare_summary(None), TypeError, "runs must be a mapping of names"),
        (lambda: viz.compare_table({"a": 3}), TypeError, r"runs\['a'\] must be a run's history"),
        (lambda: viz.sweep_chart({"a": saved}, x="nope"), ValueError, "x='nope' is no setting"),
        (lambda: viz.sweep_chart({"a": saved}, figures=("nope",)), ValueError, "figures must be"),
        (lambda: viz.compare_table({"a": saved}, full="yes"), TypeError, "full must be True"),
    ]:
        with pytest.raises(error, match=match):
            call()
    assert viz.compare_table({}).empty  # (a table of no run is empty)


def test_a_run_without_records_draws_every_view_empty_and_saying_why():
    """record='off' keeps no step: each chart of the views says so (batch composition, the KV
    pool and SLO misses failed in pandas' words), a comparison's chart names the run."""
    from workbench.viz import charts
    from workbench.viz.common import NO_STEPS

    wb = Workbench("tiny-llama", record="off")
    wb.add_request(PROMPTS[0], greedy(4))
    wb.run(progress=False)
    history = wb.history
    drawn = {
        c.name: json.dumps(c.draw(history, 0 if c.per_step else None).to_dict())
        for c in charts.CHARTS
    }
    for name in ("batch_composition", "kv_usage", "step_times"):
        assert NO_STEPS in drawn[name], name
    assert NO_STEPS in json.dumps(viz.slo_misses(history, {"ttft_ms": 100}).to_dict())
    with pytest.raises(ValueError, match="run 'off' has no step records"):
        viz.compare_chart({"off": wb.snapshot()})
    wb.close()


def test_charts_from_a_live_and_a_loaded_run_are_the_same(run):
    wb, loaded = run
    step = int(wb.history.steps.step[wb.history.steps.batch_size.idxmax()])
    live, again = specs(wb.history, step), specs(loaded, step)
    assert json.dumps(live, sort_keys=True, default=str) == json.dumps(
        again, sort_keys=True, default=str
    )
    # the page table shows the prefix the second request shares with the first (while both are
    # in the batch: "shared", not "prefix cache", which is a prefix no other row holds)
    owners = set()
    for step in loaded.pages.step.unique():
        rows = loaded.pages_at(step)
        ledger = loaded.ledger[loaded.ledger.step == step]
        cached = dict(zip(ledger.uid, ledger.cached_tokens))
        owners |= set(viz.request_charts.sharing_segments(rows, cached).owner)
    assert owners == {"own", "shared"}


def test_the_page_table_tells_the_prefix_caches_pages_from_own():
    """A request admitted after another finished matches its prompt in the radix cache: its
    first pages are the cache's, drawn apart from its own."""
    wb = Workbench("tiny-llama", record="full", max_running_reqs=2)
    wb.add_request(PROMPTS[3], greedy(3))
    wb.run(progress=False)
    uid = wb.add_request(PROMPTS[3] + " and then", greedy(3))
    record = wb.step()
    (row,) = [r for r in record.rows if r.uid == uid]
    assert row.cached_tokens > 0
    spec = json.dumps(viz.page_table(wb.history, record.step).to_dict())
    assert '"prefix cache"' in spec and '"own"' in spec
    pages = wb.history.pages_at(record.step)
    segments = viz.request_charts.sharing_segments(pages, {uid: row.cached_tokens})
    cache = segments[segments.owner == "prefix cache"]
    assert cache.pos_start.min() == 0 and cache.pos_end.max() == row.cached_tokens


def test_step_axes_start_at_zero_with_whole_steps_and_colours_have_legends(run):
    wb, _ = run
    history = wb.history
    charts = {
        name: json.loads(json.dumps(getattr(viz, name)(history, highlight_step=1).to_dict()))
        for name in (
            "batch_composition",
            "kv_usage",
            "step_times",
            "step_breakdown",
            "ledger_lines",
        )
    }
    charts["admissions"] = viz.admissions(history).to_dict()
    for name, spec in charts.items():
        text = json.dumps(spec)
        assert '"domainMin": 0' in text and '"tickMinStep": 1' in text, name
        assert "step_end" not in re.findall(r'"title": "([^"]*)"', text), name
        assert '"legend": null' not in text, name
    one = Workbench("tiny-llama", record="light")
    one.add_request(PROMPTS[0], greedy(2))
    one.step()
    kv = viz.kv_usage(one.history).to_dict()
    (values,) = [v for v in kv["datasets"].values()]
    assert len({row["x"] for row in values}) == 2  # one step still spans [0, 1]: an area


def test_a_one_step_run_is_counted_as_one_step_in_every_view():
    """The step-time chart's title, the dashboard's status line and the summary count steps
    alike: "1 step", not "1 steps"."""
    with Workbench("tiny-llama", record="light") as one:
        one.add_request(PROMPTS[0], greedy(2))
        one.step()
        title = json.dumps(viz.step_times(one.history).to_dict())
        assert re.search(r"host-bound in \d+ of 1 step\b", title), title
        status = Dashboard(one).status.value
        assert re.search(r"host-bound: .+; \d+ of 1 step in the run", status), status
        assert "1 request · " in status
        assert re.search(r"\d+ of 1 step host-bound", describe("one", run_causes(one.history)))


def test_step_times_stack_the_host_stages_against_the_device(run):
    from workbench.clocks import HOST_STAGES
    from workbench.runs import RunHistory

    wb, loaded = run
    steps = wb.history.steps
    spec = viz.step_times(wb.history).to_dict()
    bars, device = [d for d in spec["datasets"].values()]
    # on the CPU the forward and sampling are the device's work (the line), not bars
    own = [s for s in HOST_STAGES if s not in ("forward", "sample")]
    assert {row["stage"] for row in bars} == set(own)
    for step, row in steps.set_index("step").iterrows():  # the bars stack to the host's own
        stacked = sum(b["ms"] for b in bars if b["bin"] == step)
        assert stacked == pytest.approx(sum(row[f"host_{s}_ms"] for s in own)), step
    assert [d["device_ms"] for d in device] == pytest.approx(list(steps.device_ms))
    # host-bound: the host's work without the forward and sampling (device_ms) above them
    bound = sum(h - d > d for h, d in zip(steps.host_ms, steps.device_ms))
    assert f"host-bound in {bound} of {len(steps)} steps" in json.dumps(spec)
    # a run saved before the split: its host time whole
    frames = {name: getattr(loaded, name) for name in ("steps", "ledger", "requests")}
    frames["steps"] = frames["steps"].drop(columns=[f"host_{s}_ms" for s in HOST_STAGES])
    old = viz.step_times(RunHistory(frames, {})).to_dict()
    bars, _ = [d for d in old["datasets"].values()]
    assert {row["stage"] for row in bars} == {"host"}


def test_charts_offline_and_png(run, tmp_path):
    wb, _ = run
    chart = viz.batch_composition(wb.history, highlight_step=2)
    png = save_png(chart, tmp_path / "batch.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = chart.to_html(inline=True)
    assert "cdn.jsdelivr" not in html


@pytest.mark.slow  # ~11 s
def test_thousands_of_steps_are_aggregated():
    """More steps than bars (MAX_BARS) and more request points than MAX_POINTS: binned and
    thinned, under Altair's 5,000 rows."""
    wb = Workbench("tiny-llama", max_running_reqs=4)
    for i, n in enumerate((1300, 1250, 1200, 700)):
        wb.add_request([1 + i, 2, 3], SamplingParams(max_tokens=n, ignore_eos=True))
    wb.run(progress=False)
    history = wb.history
    assert len(history.steps) > 2 * viz.common.MAX_BARS
    assert len(history.ledger) > viz.common.MAX_POINTS
    for name in ALL_CHARTS:
        spec = getattr(viz, name)(history).to_dict()  # would raise MaxRowsError above 5000 rows
        rows = sum(len(d) for d in spec.get("datasets", {}).values())
        assert rows <= 5000, (name, rows)


def test_report_is_one_offline_file(run, tmp_path):
    wb, loaded = run
    path = write_report(loaded, tmp_path / "report.html", title="test run")
    text = path.read_text()
    assert text.count("vegaEmbed('#fig") == 9
    assert not re.search(r"<script[^>]+src=", text)  # nothing to fetch
    assert "cdn.jsdelivr" not in text and "test run" in text
    # what the records say of the run, in a sentence under the summary's heading
    said = describe("This run", run_causes(loaded))
    assert f"<h2>Summary</h2>\n<p>{html.escape(said)}</p>" in text and "host-bound" in said
    assert wb.report(tmp_path / "live.html").stat().st_size > 500_000  # the bundle is inline
    # each request's prompt and answer, from the live run and from the saved one alike
    outputs = wb.outputs()
    for report in (tmp_path / "live.html", loaded.report(tmp_path / "saved.html")):
        page = report.read_text()
        assert "Prompts and answers" in page
        for out in outputs:
            assert html.escape(out["text"]) in page
        assert html.escape(PROMPTS[0]) in page


def test_a_chart_added_to_the_registry_shows_everywhere(run, tmp_path, monkeypatch):
    """One line in `charts.CHARTS` is all a new chart needs: the dashboard draws it for the
    step and request in focus, the report includes it under its title, `viz` exports it."""
    from workbench.viz import charts

    wb, loaded = run
    drawn = []

    def tokens_per_step(history, highlight_step=None, highlight_uid=None):
        drawn.append((highlight_step, highlight_uid))
        return viz.kv_usage(history, highlight_step)

    extra = charts.Chart(
        "tokens_per_step", "Tokens per step", tokens_per_step, "highlight_step", "highlight_uid"
    )
    monkeypatch.setattr(charts, "CHARTS", (*charts.CHARTS, extra))
    monkeypatch.setitem(charts.BY_NAME, "tokens_per_step", extra)
    assert viz.tokens_per_step is tokens_per_step and "tokens_per_step" in dir(viz)
    dash = loaded.dashboard()
    assert "tokens_per_step" in dash.charts
    dash.slider.value, dash.picker.value = 1, int(loaded.requests.uid.iloc[0])
    assert drawn[-1] == (1, int(loaded.requests.uid.iloc[0]))
    page = loaded.report(tmp_path / "extra.html").read_text()
    assert "Tokens per step" in page and page.count("vegaEmbed('#fig") == 10
    # every registered chart draws with the one signature, with or without a focus
    for chart in charts.CHARTS:
        for step, uid in ((None, None), (1, int(loaded.requests.uid.iloc[0]))):
            assert chart.draw(loaded, step, uid).to_dict()


def test_dashboard_steps_and_redraws():
    wb = Workbench("tiny-llama", record="full", max_extend_tokens=8, max_running_reqs=2)
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(4))
    dash = wb.dashboard()
    assert "no steps yet" in dash.status.value
    dash.buttons["Step"].click()
    assert dash.slider.value == dash.slider.max == 0 and "step 0" in dash.status.value
    before = json.dumps(dash.charts["ledger_bars"].chart.to_dict(), default=str)
    wb.step()  # a step from "another cell" redraws too
    assert dash.slider.max == 1 and "step 1" in dash.status.value
    assert json.dumps(dash.charts["ledger_bars"].chart.to_dict(), default=str) != before
    dash.slider.value = 0  # look back
    assert "step 0" in dash.status.value
    dash.picker.value = 1  # highlight request 1 everywhere
    assert "datum.uid == 1" in json.dumps(dash.charts["admissions"].chart.to_dict())
    assert not dash.buttons["Abort"].disabled
    dash.buttons["Abort"].click()  # abort the picked request
    assert wb.scheduler.finished[1].finish_reason == "abort"
    assert dash.buttons["Abort"].disabled
    dash.buttons["Run"].click()
    assert wb.is_done and dash.slider.value == dash.slider.max == len(wb.history) - 1
    assert [o["finish_reason"] for o in wb.outputs()] == ["length", "abort", "length"]
    wb.check_integrity()
    state = dash.charts["batch_composition"].get_state()
    assert state["spec"]["datasets"]  # the widget holds the data to draw
    dash.buttons["Reset"].click()
    assert len(wb.history) == 0 and "no steps yet" in dash.status.value
    dash.close()  # it no longer follows the workbench
    wb.add_request(PROMPTS[0], greedy(2))
    wb.step()
    assert "no steps yet" in dash.status.value


def test_without_vl_convert_the_report_and_dashboard_load_vega_from_the_cdn(
    run, tmp_path, monkeypatch
):
    """vl-convert-python carries Vega's JavaScript for pages that open offline; where it is
    missing (the lent H100's image lacked it) the views still come, loading Vega from the
    CDN, and say so."""
    import altair as alt

    _, loaded = run
    monkeypatch.setitem(sys.modules, "vl_convert", None)  # `import vl_convert` fails
    monkeypatch.setattr(viz.common, "_CDN_NOTED", False)
    monkeypatch.setattr(alt.JupyterChart, "_is_offline", False)
    with pytest.warns(UserWarning, match="vl-convert-python is not installed"):
        text = write_report(loaded, tmp_path / "report.html").read_text()
    assert text.count("vegaEmbed('#fig") == 9
    sources = re.findall(r'<script src="([^"]+)"></script>', text)
    assert [s.rsplit("/", 1)[1].split("@")[0] for s in sources] == [
        "vega",
        "vega-lite",
        "vega-embed",
    ]
    assert "stay blank without a network" in text
    dash = Dashboard(loaded)  # asked vl-convert for its bundle before
    assert dash.slider.max == len(loaded) - 1 and not alt.JupyterChart._is_offline


def test_dashboard_on_a_saved_run_has_no_engine_buttons(run):
    _, loaded = run
    dash = Dashboard(loaded)
    assert dash.buttons == {} and dash.slider.max == len(loaded) - 1
    assert "step" in dash.status.value


@pytest.mark.parametrize(("requests", "tokens"), [(40, 150), (130, 40)])
@pytest.mark.slow  # ~7 s
def test_many_long_requests_stay_under_the_row_limit(requests, tokens):
    """Lines of many requests over many steps are sampled and thinned, and the picked request
    is always drawn (40 x 150: few lines, long; 130 x 40: more lines than are drawn)."""
    wb = Workbench("tiny-llama", max_running_reqs=requests)
    for i in range(requests):
        wb.add_request([1 + i % 50, 2, 3], SamplingParams(max_tokens=tokens, ignore_eos=True))
    wb.run(progress=False)
    assert len(wb.history.ledger) > 5000
    picked = 1  # with 130 requests, not in the every-k-th sample
    for name in ALL_CHARTS:
        spec = getattr(viz, name)(wb.history).to_dict()
        assert sum(len(d) for d in spec.get("datasets", {}).values()) <= 5000, name
    spec = viz.ledger_lines(wb.history, picked).to_dict()
    (drawn,) = [d for d in spec["datasets"].values() if d and "uid" in d[0]]
    lines = {row["uid"] for row in drawn}
    assert picked in lines and len(lines) <= 61
    # charts with a row per request stay a screen tall
    last = int(wb.history.steps.step.iloc[-1])
    heights = [viz.ledger_bars(wb.history, last // 2).to_dict()["height"]]
    heights.append(viz.admissions(wb.history).to_dict()["height"])
    assert all(h <= 480 for h in heights), heights
    # each drawn line still starts and ends where the request did
    ledger = wb.history.ledger
    for uid in lines:
        steps = [row["step"] for row in drawn if row["uid"] == uid]
        mine = ledger[ledger.uid == uid].step
        assert min(steps) == mine.min() and max(steps) == mine.max()


def test_dashboard_after_reset_clears_its_views_and_follows_again():
    """Reset empties every view and says what to do next; Again runs the same requests; steps
    from another cell are followed after a reset as before it."""
    wb = Workbench("tiny-llama", record="light", max_extend_tokens=8, max_running_reqs=2)
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(4))
    dash = wb.dashboard()
    dash.buttons["Run"].click()
    first = [o["token_ids"] for o in wb.outputs()]
    assert dash.slider.max > 3 and len(dash.picker.options) == 4
    assert all(dash.buttons[b].disabled for b in ("Step", "Step ×", "Run"))
    assert "nothing is waiting or running" in dash.buttons["Run"].tooltip
    dash.picker.value = 2
    dash.buttons["Reset"].click()
    assert (dash.slider.min, dash.slider.max, dash.slider.value) == (0, 0, 0)
    assert dash.picker.options == (("all", -1),) and dash.picker.value == -1
    assert "Again" in dash.status.value and "wb.add_request" in dash.status.value
    for view in dash.charts.values():
        assert "no steps yet" in json.dumps(view.chart.to_dict())
    assert not dash.buttons["Again"].disabled and "same 3 requests" in dash.buttons["Again"].tooltip
    dash.buttons["Again"].click()
    assert wb.submitted_count == 3 and not dash.buttons["Step"].disabled
    assert "press Step or Run" in dash.status.value
    wb.run(progress=False)  # from another cell
    assert dash.slider.value == dash.slider.max == len(wb.history) - 1
    assert f"step {dash.slider.max}</b> of {dash.slider.max}" in dash.status.value
    assert [o["token_ids"] for o in wb.outputs()] == first  # the same run again
    wb.check_integrity()
    dash.buttons["Reset"].click()
    wb.add_request(PROMPTS[4], greedy(2))  # a request from another cell: Step can act now
    assert not dash.buttons["Step"].disabled and "press Step or Run" in dash.status.value
    dash.close()


def test_dashboard_step_n_shows_progress_and_redraws_are_throttled():
    """Step × N reports its progress while it runs; during a run the views redraw only after
    the engine has stepped for several times what a redraw costs (never once per step)."""
    wb = Workbench("tiny-llama", record="light", max_extend_tokens=4, max_running_reqs=2)
    for p in PROMPTS:
        wb.add_request(p, greedy(8))
    dash = wb.dashboard()
    seen, redraws = [], []
    wb.observe(lambda final: seen.append(dash.status.value))
    original = dash._redraw
    dash._redraw = lambda: (redraws.append(wb.step_index), original())[1]
    dash.count.value = 6
    dash.buttons["Step ×"].click()
    assert wb.step_index == 6
    assert any("running: " in s and " of 6 steps" in s for s in seen)
    assert "running: " not in dash.status.value  # done: the plain status again
    redraws.clear()
    dash.buttons["Run"].click()
    steps = wb.step_index - 6
    assert wb.is_done and steps > 10
    assert len(redraws) < steps / 2  # throttled, and the last step is drawn
    assert dash.slider.value == dash.slider.max == wb.step_index - 1
    dash.close()


def test_a_saved_run_opens_in_the_dashboard(run, tmp_path):
    wb, loaded = run
    assert isinstance(loaded.dashboard(), viz.Dashboard)
    dash = loaded.dashboard()
    assert dash.buttons == {} and dash.slider.max == len(loaded) - 1
    assert json.dumps(dash.charts["ledger_bars"].chart.to_dict(), default=str)


def test_a_button_whose_step_fails_says_so_in_the_status():
    """A button has no cell to print to: the error of the step it ran shows in the status."""
    wb = Workbench("tiny-llama", record="light")
    wb.add_request(PROMPTS[0], greedy(3))
    dash = wb.dashboard()
    handle = wb.hooks.add("step.end", lambda record: 1 / 0)
    dash.buttons["Step"].click()
    assert "HookError" in dash.status.value and "ZeroDivisionError" in dash.status.value
    handle.remove()
    dash.buttons["Run"].click()
    assert wb.is_done and "step" in dash.status.value
    wb.check_integrity()
    dash.close()


def test_each_admission_decision_keeps_its_colour_in_every_view(run):
    """A refusal reason has one colour whichever reasons a run has, and whether its admissions
    are drawn per request or aggregated over thousands of rows."""
    from workbench.palette import DECISION_COLORS
    from workbench.runs import RunHistory

    live, _ = run

    def scale(history):
        spec = viz.admissions(history).to_dict()
        layer = spec.get("encoding") or spec["layer"][0]["encoding"]
        return dict(zip(layer["color"]["scale"]["domain"], layer["color"]["scale"]["range"]))

    small = scale(live.history)
    tables = dict(live.history.tables())
    many = tables["admissions"].sample(n=4001, replace=True, random_state=0)
    aggregated = scale(RunHistory({**tables, "admissions": many}, {}))
    assert small == aggregated == DECISION_COLORS
    from workbench.core.admission import REASONS

    assert set(REASONS) | {"admitted"} == set(DECISION_COLORS)


def test_page_table_segments_say_shared_cached_and_own_slot_by_slot():
    """Two rows reading the same slots are "shared"; a row's matched prefix that no other row
    holds is the prefix cache's; the rest is its own; a run splits where its owner changes."""
    import pandas as pd

    rows = pd.DataFrame(
        {
            "uid": [1, 2, 3],
            "table_idx": [0, 1, 2],
            "pos_start": [0, 0, 0],
            "pos_end": [6, 8, 5],
            "slot_start": [100, 100, 200],
        }
    )
    segments = viz.request_charts.sharing_segments(rows, {2: 6, 3: 3})
    columns = ["uid", "pos_start", "pos_end", "slot_start", "owner"]
    got = [tuple(r) for r in segments[columns].itertuples(index=False)]
    assert got == [
        (1, 0, 6, 100, "shared"),
        (2, 0, 6, 100, "shared"),
        (2, 6, 8, 106, "own"),
        (3, 0, 3, 200, "prefix cache"),
        (3, 3, 5, 203, "own"),
    ]


def test_the_timeline_keeps_hook_ranges_apart_from_kernel_families(run):
    wb, _ = run
    step = int(wb.history.events.step.max())
    spec = viz.kernel_timeline(wb.history, step).to_dict()
    layers = spec["layer"]
    titles = [layer["encoding"]["color"]["title"] for layer in layers]
    assert titles == ["hook range", "kernel family"]
    assert spec["resolve"]["scale"]["color"] == "independent"
    lanes = layers[0]["encoding"]["y"]["sort"]
    hooks = [lane for lane in lanes if lane.startswith("hooks")]
    assert hooks and lanes[: len(hooks)] == hooks  # the hook lanes on top
    from workbench.palette import FAMILY_COLORS, HOOK_COLORS

    assert not set(HOOK_COLORS.values()) & set(FAMILY_COLORS.values())


def test_flashinfers_norm_activation_rope_and_sampling_kernels_are_not_attention():
    """FlashInfer names all its kernels `flashinfer::...`: only its attention kernels count as
    attention (on the H200 its add + RMSNorm once did, 0.29 ms of a 30B-A3B step at batch 256)."""
    from workbench.history.families import family

    kernels = {
        "void flashinfer::BatchPrefillWithPagedKVCacheKernel<true, flashinfer::KernelTraits<>": (
            "attention"
        ),
        "void flashinfer::BatchDecodeWithPagedKVCacheKernel<>": "attention",
        "void flashinfer::SingleDecodeWithKVCacheKernel<>": "attention",
        "void flashinfer::PersistentVariableLengthMergeStatesKernel<8u, 16u>": "attention",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>": "attention",
        "_decode_attention": "attention",
        "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>": "norm/rope/act",
        "void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>": "norm/rope/act",
        "void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<>": "norm/rope/act",
        "void flashinfer::sampling::TopKTopPSamplingFromProbKernel<>": "sampling",
        "_small_gemm": "matmul",
    }
    assert {name: family(name, "kernel") for name in kernels} == kernels


def test_kernels_started_early_count_from_the_end_of_those_they_follow():
    """With programmatic dependent launch a kernel starts before the one it follows ends and
    waits inside for it (on the H100, 2026-12-06, a batch-8 step's kernels added up to 2.78 ms
    in a 1.58 ms step): each counts from where the ones before it ended, so a step's kernels
    add up to the time some kernel ran, and events that do not overlap keep their durations."""
    import pandas as pd

    from workbench.history.families import exclusive_us

    events = pd.DataFrame(
        [  # (step, rank, start, duration): a chain of early starts, a gap, one inside another
            (0, 0, 0.0, 10.0),
            (0, 0, 4.0, 10.0),  # waits 6 us for the first
            (0, 0, 12.0, 5.0),  # waits 2 us for the second
            (0, 0, 30.0, 8.0),  # after a gap
            (0, 0, 31.0, 2.0),  # inside the one before
            (1, 0, 5.0, 3.0),  # another step: not held back by step 0's kernels
            (0, 1, 2.0, 4.0),  # another rank's device
        ],
        columns=["step", "rank", "start_us", "duration_us"],
    ).sample(frac=1.0, random_state=0)  # in no particular order
    got = exclusive_us(events).sort_index().tolist()
    assert got == [10.0, 4.0, 3.0, 8.0, 0.0, 3.0, 4.0]


def test_a_runs_kernel_families_add_up_to_each_profiled_steps_span(run):
    """On the CPU some operators that time is counted on call others of the list (`aten::embedding`
    calls `aten::index_select`): the time counts once, on the caller. A step's families,
    "between kernels" and "idle" add up to its span."""
    from workbench.history.families import breakdown_table, leaf_events

    wb, _ = run
    history = wb.history
    leaf = leaf_events(history.events)
    assert (leaf.exclusive_us <= leaf.duration_us).all()
    inner = leaf[leaf.name == "aten::index_select"]
    # (its end may pass its caller's by the clock's quarter microseconds)
    assert not inner.empty and (inner.exclusive_us < 0.05 * inner.duration_us).all()
    table = breakdown_table(history)
    per_step = table.groupby("step").ms.sum()
    steps = history.steps.set_index("step").reindex(per_step.index)
    assert per_step.to_numpy() == pytest.approx((steps.device_ms + steps.idle_ms).to_numpy())
    kernels = table[~table.family.isin(["between kernels", "idle"])].groupby("step").ms.sum()
    assert (kernels <= steps.device_ms.reindex(kernels.index) + 1e-9).all()

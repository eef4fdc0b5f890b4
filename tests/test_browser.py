"""Every notebook in a real JupyterLab, in a real (headless) Chromium, with no network: run all
cells (on tiny-llama, `WORKBENCH_MODEL`); every chart must draw (an SVG or a canvas), no script
may fail to load, nothing may come from outside the local server, and no cell may show an error.
In the quickstart, press Step in the dashboard and check that the step counter advanced and the
charts redrew.

Needs Debian's chromium (/usr/bin/chromium) and the Python package playwright; `make test` installs
both (the browser is never downloaded by playwright). Screenshots go to out/test-artifacts/.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "out" / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

# one browser and one JupyterLab at a time: `make test` keeps a module on one worker
pytestmark = pytest.mark.browser
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: `make test` installs it (apt-get install chromium)")
    root = tmp_path_factory.mktemp("lab")
    for notebook in NOTEBOOKS:
        shutil.copy(notebook, root)
    shutil.copytree(ROOT / "notebooks" / "data", root / "data")  # notebook 06's recorded runs
    # every cell drawn, also off screen (the default skips rendering what is out of view)
    settings = tmp_path_factory.mktemp("settings")
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text('{"windowingMode": "none"}')
    port = _free_port()
    log = open(root / "jupyter.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.token=",
            "--ServerApp.password=",
            f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True",
            f"--LabApp.user_settings_dir={settings}",
            "--LabApp.news_url=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # NOTE: the notebooks' kernels run tiny-llama (SmolLM2's tokenizer and architecture, two
        # small layers): this test is of the views in a browser, which no model changes; the
        # default model's path on the CPU is the demo's test (test_bench.py)
        # (notebook 06 simulates its recorded model on the CPU: WORKBENCH_QUICK, fewer settings)
        env={
            **os.environ,
            "JUPYTER_PLATFORM_DIRS": "1",
            "WORKBENCH_MODEL": "tiny-llama",
            "WORKBENCH_QUICK": "1",
            # the kernels import this checkout's workbench, not the one installed in the venv
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        },
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{base}/api/status", timeout=1)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.terminate()
        pytest.fail("JupyterLab did not start: " + (root / "jupyter.log").read_text()[-2000:])
    yield base, root / "jupyter.log"
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


# The notebook panel's own kernel status, as JupyterLab's session context reports it (None: no
# kernel yet), so that waiting does not depend on how the toolbar happens to render.
KERNEL_STATUS = """() => {
    const panel = window.jupyterapp.shell.currentWidget;
    const kernel = panel && panel.sessionContext && panel.sessionContext.session
        && panel.sessionContext.session.kernel;
    return kernel ? kernel.status : null;
}"""
# Per code cell of the notebook model: its execution count (None until it has run) and the text of
# any error it raised. The model, not the DOM: JupyterLab may not render cells that are off screen.
CELL_STATES = """() => Array.from(window.jupyterapp.shell.currentWidget.content.model.cells)
    .filter(cell => cell.type === 'code')
    .map(cell => {
        const error = cell.outputs.toJSON().find(out => out.output_type === 'error');
        return {count: cell.executionCount,
                error: error ? `${error.ename}: ${error.evalue}` : null};
    })"""


def _diagnose(page, lab_log: Path, what: str) -> str:
    """What the page and the server show when the notebook did not get through."""
    page.screenshot(path=str(ARTIFACTS / "notebook-stuck.png"))
    dialogs = page.locator(".jp-Dialog")
    return (
        f"{what}\nkernel status: {page.evaluate(KERNEL_STATUS)}\n"
        f"dialog: {dialogs.first.inner_text() if dialogs.count() else None}\n"
        f"cells: {page.evaluate(CELL_STATES)}\n"
        f"jupyter log (tail): {lab_log.read_text()[-3000:]}"
    )


def _start_kernel(page, lab_log: Path, timeout_s: float = 180) -> None:
    """Wait for the notebook's kernel to be idle, taking the default kernel whenever JupyterLab
    asks which one to start (the dialog may come before or after the toolbar shows a status)."""
    deadline = time.monotonic() + timeout_s
    while page.evaluate(KERNEL_STATUS) != "idle":
        select = page.locator(".jp-Dialog").get_by_role("button", name="Select", exact=True)
        if select.count():
            select.first.click()
        if time.monotonic() > deadline:
            pytest.fail(_diagnose(page, lab_log, "the kernel did not start"))
        page.wait_for_timeout(250)


def _run_all(page, lab_log: Path, timeout_s: float = 600) -> None:
    """Run every cell and wait until each has run, failing at once with the first error."""
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    deadline = time.monotonic() + timeout_s
    page.wait_for_timeout(1000)
    while True:
        cells = page.evaluate(CELL_STATES)
        errors = [c["error"] for c in cells if c["error"]]
        if errors:
            pytest.fail(_diagnose(page, lab_log, f"a cell failed:\n{errors[0]}"))
        done = all(c["count"] is not None for c in cells)
        if done and page.evaluate(KERNEL_STATUS) == "idle":
            return
        if page.evaluate(KERNEL_STATUS) in ("dead", "autorestarting", "restarting"):
            pytest.fail(_diagnose(page, lab_log, "the kernel died"))
        if time.monotonic() > deadline:
            pytest.fail(_diagnose(page, lab_log, f"the notebook did not finish in {timeout_s} s"))
        page.wait_for_timeout(500)


def test_quickstart_dashboard_steps_in_a_real_browser(lab):
    from playwright.sync_api import sync_playwright

    base, lab_log = lab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        # 1,000 px with the file browser open: the dashboard must fit without clipping
        page = browser.new_page(viewport={"width": 1000, "height": 1100})
        page.goto(f"{base}/lab/tree/01_quickstart.ipynb?reset")
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        page.wait_for_function("window.jupyterapp !== undefined", timeout=60_000)
        _start_kernel(page, lab_log)
        _run_all(page, lab_log)
        no_news = page.get_by_role("button", name="No", exact=True)
        errors = page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']"
        )

        if no_news.count():  # JupyterLab asks about news once; the answer keeps screenshots clear
            no_news.first.click()
        status = page.locator(".jp-OutputArea-output .widget-html-content", has_text="step ").first
        status.scroll_into_view_if_needed()
        status.wait_for(timeout=60_000)
        dashboard = page.locator(
            ".jp-OutputArea-output", has=page.get_by_role("button", name="Step", exact=True)
        ).first
        charts = dashboard.locator(".vega-embed svg, .vega-embed canvas")
        assert charts.count() >= 9  # every chart drawn
        area = dashboard.bounding_box()
        for i in range(charts.count()):
            box = charts.nth(i).bounding_box()
            assert box["x"] + box["width"] <= area["x"] + area["width"] + 2, f"chart {i} clipped"
        before_text = status.inner_text()
        before_step = int(before_text.split()[1])
        before_chart = dashboard.locator(".vega-embed").nth(1).inner_html()
        dashboard.screenshot(path=str(ARTIFACTS / "dashboard-before-step.png"))

        dashboard.get_by_role("button", name="Step", exact=True).click()
        page.wait_for_function(
            "([el, before]) => el.innerText !== before",
            arg=[status.element_handle(), before_text],
            timeout=60_000,
        )
        after_step = int(status.inner_text().split()[1])
        assert after_step == before_step + 1
        # the chart is drawn again (vega takes a while on a busy machine)
        page.wait_for_function(
            "([el, before]) => el.innerHTML !== before",
            arg=[dashboard.locator(".vega-embed").nth(1).element_handle(), before_chart],
            timeout=30_000,
        )
        assert dashboard.locator(".vega-embed svg, .vega-embed canvas").count() >= 9
        assert errors.count() == 0
        dashboard.screenshot(path=str(ARTIFACTS / "dashboard-after-step.png"))
        # no contradiction: the dashboard counts the host-bound steps the run's summary counts
        # (the summary was taken before the Step above; the step-time chart's title gives the
        # dashboard's count too, from the same column)
        (summary,) = [s for s in _summary_items(page) if s.startswith("this run: ")]
        bound, steps = map(int, re.search(r"(\d+) of (\d+) steps host-bound", summary).groups())
        text = status.inner_text()
        shown = re.search(r"host-bound: (.+?); (\d+) of (\d+) steps in the run", text)
        assert shown, text
        here, counted, of = shown.group(1), int(shown.group(2)), int(shown.group(3))
        assert of == steps + 1 and counted == bound + (here == "this step"), (summary, text)
        # everything the page loaded came from the local JupyterLab (no CDN): the browser's
        # own record of every resource it fetched
        urls = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
        outside = [u for u in urls if not u.startswith((base, "data:", "blob:"))]
        assert urls and not outside, f"loaded from the network: {outside[:5]}"
        page.screenshot(path=str(ARTIFACTS / "notebook.png"), full_page=False)
        browser.close()


def _open_and_run(page, base: str, lab_log: Path, name: str) -> None:
    page.goto(f"{base}/lab/tree/{name}?reset")
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    page.wait_for_function("window.jupyterapp !== undefined", timeout=60_000)
    _start_kernel(page, lab_log)
    _run_all(page, lab_log)
    no_news = page.get_by_role("button", name="No", exact=True)
    if no_news.count():
        no_news.first.click()


# Every chart output of the notebook (widget or HTML): drawn when it holds an SVG or a canvas.
# a chart drawn by Vega in the page, or one rendered to an image in the kernel (notebook 04)
CHARTS = """() => [
    ...Array.from(document.querySelectorAll('.jp-OutputArea-output .vega-embed'))
        .map(el => el.querySelector('svg, canvas') !== null),
    ...Array.from(document.querySelectorAll(
        ".jp-OutputArea-output[data-mime-type='image/png'] img"
    )).map(img => img.complete && img.naturalWidth > 0),
]"""


def _wait_for_charts(page, timeout_ms: float = 15_000) -> list[bool]:
    """Each chart's state once Vega has drawn them all (then half a second more, for outputs
    still arriving), or at the timeout."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"({CHARTS})().every(Boolean)", timeout=timeout_ms)
        page.wait_for_timeout(500)
        page.wait_for_function(f"({CHARTS})().every(Boolean)", timeout=timeout_ms)
    except PlaywrightTimeout:
        pass  # the caller says which did not draw
    return page.evaluate(CHARTS)


@pytest.mark.parametrize(
    "notebook",
    [
        # notebook 04 (comparing settings) in make test; each of the others ~25-55 s: -m slow
        pytest.param(n.name, id=n.name[:2], marks=[] if n.name[:2] == "04" else pytest.mark.slow)
        for n in NOTEBOOKS
        if not n.name.startswith("01")
    ],
)
def test_every_chart_of_a_notebook_draws_offline(lab, notebook):
    """The charts outside the dashboard (page table, ledger lines, batch composition, the
    comparisons) draw offline too: importing workbench.viz selects Altair's offline renderer."""
    from playwright.sync_api import sync_playwright

    base, lab_log = lab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        _open_and_run(page, base, lab_log, notebook)
        drawn = _wait_for_charts(page)
        text = page.locator(".jp-Notebook").inner_text()
        page.screenshot(path=str(ARTIFACTS / f"{notebook[:2]}-notebook.png"), full_page=False)
        assert drawn and all(drawn), f"{notebook}: charts drawn {drawn}"
        assert "Error loading script" not in text
        if notebook.startswith("03"):  # the comparison shows every column it has, and says why
            from workbench.viz.compare import SHORT

            table = page.locator(".jp-OutputArea-output table.dataframe").first
            heads = [" ".join(h.split()) for h in table.locator("thead th").all_inner_texts()]
            heads = [h for h in heads if h]
            # none elided ("..."): every figure, each followed by its noise where it has one
            assert [h for h in heads if not h.endswith("±")] == [*SHORT, "repeats"], heads
            noise = [(heads[i - 1], h) for i, h in enumerate(heads) if h.endswith("±")]
            assert all(h == f"{figure} ±" for figure, h in noise), heads
            said = _summary_items(page)
            assert any(s.startswith("Time to first token ") for s in said), said
        if notebook.startswith("04"):
            _check_summary_04(page)
        if notebook.startswith("06"):
            _check_summary_06(page, text)
        if notebook.startswith("07"):  # served from the notebook, the dashboard following
            # (a chat answer, its log probabilities' request, two scored, then twelve streamed)
            assert "12 answers streamed" in text and "'http': 16" in text
            assert re.search(r"'\s+\d+\.\d%\s+then: '", text), "no log probabilities"
            scores = re.findall(r"' Paris': log-likelihood (-\d+\.\d+)", text)
            assert scores, "no score of a continuation"
            status = page.locator(".jp-OutputArea-output .widget-html-content", has_text="step ")
            shown = re.search(r"step (\d+) of (\d+)", status.first.inner_text())
            assert shown and int(shown.group(2)) > 12, status.first.inner_text()
        errors = page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']"
        )
        assert errors.count() == 0
        urls = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
        outside = [u for u in urls if not u.startswith((base, "data:", "blob:"))]
        assert not outside, f"loaded from the network: {outside[:5]}"
        browser.close()


def _summary_items(page) -> list[str]:
    """The sentences of the summaries the notebook shows (`compare_summary`'s HTML: a list)."""
    items = page.locator(".jp-OutputArea-output ul > li")
    return [t.strip() for t in items.all_inner_texts()]


def _check_summary_04(page) -> None:
    """Notebook 04 says in sentences what its table shows: a winner only beyond the noise the
    table prints beside it, the host-bound steps the table counts; no Python list printed."""
    said = _summary_items(page)
    assert said and not any(s.startswith(("[", "'")) for s in said), said
    table = page.locator(".jp-OutputArea-output table.dataframe").first
    heads = [h.strip() for h in table.locator("thead th").all_inner_texts()][1:]
    rows = {}
    for row in table.locator("tbody tr").all():
        name = row.locator("th").first.inner_text().strip()
        rows[name] = [c.strip() for c in row.locator("td").all_inner_texts()]
    assert "mean step bound (ms)" not in rows  # nothing to show on a CPU: no NaN row
    # counts print as whole numbers (their noise beside them over repeats)
    assert all(re.fullmatch(r"\d+( ± [\d.]+)?", v) for v in rows["steps"]), rows["steps"]

    def number(text: str) -> float:
        return float(text.replace(",", ""))

    (host,) = [s for s in said if s.startswith("Host-bound steps")]
    for setting, bound, steps in zip(heads, rows["host-bound steps"], rows["steps"]):
        bound, steps = (number(v.split(" ± ")[0]) for v in (bound, steps))
        assert f"{setting} {bound:g} of {steps:g}" in host, (host, setting)
    (ttft,) = [s for s in said if s.startswith("Time to first token")]
    cells = {h: [number(v) for v in c.split(" ± ")] for h, c in zip(heads, rows["p50 TTFT (ms)"])}
    best = min(cells, key=lambda h: cells[h][0])
    worst = max(cells, key=lambda h: cells[h][0])
    beyond = cells[worst][0] - cells[best][0] > cells[best][1] + cells[worst][1]
    assert ("ties within noise" not in ttft) == beyond, (ttft, cells)


def _check_summary_06(page, text: str) -> None:
    """Notebook 06's sentences state the figures of the validation summary it shows: each
    figure's median and worst error as the table has them (no number typed into the text)."""
    table = page.locator(".jp-OutputArea-output table.dataframe", has_text="median_error_pct")
    table = table.first
    heads = [h.strip() for h in table.locator("thead tr").first.locator("th").all_inner_texts()]
    rows = {}
    for row in table.locator("tbody tr").all():
        name = row.locator("th").first.inner_text().strip()
        rows[name] = dict(zip(heads[1:], [c.strip() for c in row.locator("td").all_inner_texts()]))
    checked = 0
    for figure in ("p95 TTFT (ms)", "median ITL (ms)", "E2E (ms)", "throughput (tok/s)"):
        median = float(rows[figure]["median_error_pct"])
        worst = float(rows[figure]["max_error_pct"])
        said = f"{figure}: the twin is {median:.1f}% off in the median setting (worst {worst:.1f}%)"
        assert said in text, (said, rows[figure])
        checked += 1
    assert checked == 4


def test_the_report_fits_the_page_offline(tmp_path):
    """The static report at 1,000 px: nothing wider than the page, every chart drawn, the
    prompts and answers shown, nothing fetched."""
    from playwright.sync_api import sync_playwright

    from workbench import SamplingParams, Workbench

    wb = Workbench("tiny-llama", record="full", max_extend_tokens=8, max_running_reqs=2)
    for p in ("Hello, my name is", "The capital of France is a city that"):
        wb.add_request(p, SamplingParams(max_tokens=6))
    wb.run(progress=False)
    path = wb.report(tmp_path / "report.html")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.goto(path.as_uri())
        page.wait_for_function("document.querySelectorAll('.vega-embed svg').length >= 9")
        width = page.evaluate("document.documentElement.scrollWidth")
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        assert width <= 1000, f"the report is {width} px wide"
        assert "The capital of France is a city that" in page.locator(".texts").inner_text()
        urls = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
        assert all(u.startswith(("file:", "data:", "blob:")) for u in urls), urls[:5]
        browser.close()


# The sequence of issue #26 that left the dashboard at "step 0 of 25": each cell prints the
# engine's last step, which the dashboard's status must show once the cell has ended.
SEQUENCE = [
    "import torch\n\nfrom workbench import SamplingParams, Workbench\n\n"
    "torch.set_num_threads(1)\n"
    "wb = Workbench('tiny-llama', max_extend_tokens=8, max_running_reqs=2)\n"
    "for prompt in ['Hello, my name is', 'The capital of France is', 'Once upon a time']:\n"
    "    wb.add_request(prompt, SamplingParams(max_tokens=8))\n"
    "last = lambda: print('engine at step', int(wb.history.steps.step.iloc[-1]))\n"
    "wb.dashboard()",
    "wb.run(progress=False)\nlast()",
    "wb.reset(again=True)\nwb.run(progress=False)\nlast()",
    "wb.reset(again=True)\nwb.step()\nlast()",
    "wb.step()\nlast()",
    "last()",  # after the Step and Run buttons
]


def _run_cell(page, lab_log: Path, index: int) -> str:
    """Run one cell, wait until it has run and the kernel is idle; what it printed."""
    page.evaluate(
        """(i) => { const panel = window.jupyterapp.shell.currentWidget;
        panel.content.activeCellIndex = i;
        window.jupyterapp.commands.execute('notebook:run-cell'); }""",
        index,
    )
    deadline = time.monotonic() + 180
    while True:
        cell = page.evaluate(CELL_STATES)[index]
        if cell["error"]:
            pytest.fail(_diagnose(page, lab_log, f"cell {index} failed:\n{cell['error']}"))
        if cell["count"] is not None and page.evaluate(KERNEL_STATUS) == "idle":
            break
        if time.monotonic() > deadline:
            pytest.fail(_diagnose(page, lab_log, f"cell {index} did not finish"))
        page.wait_for_timeout(200)
    outputs = page.evaluate(
        "(i) => window.jupyterapp.shell.currentWidget.content.model.cells.get(i).outputs.toJSON()",
        index,
    )
    return "".join(out.get("text", "") for out in outputs)


def _settled(page, status, quiet_ms: int = 2000) -> str:
    """The status once nothing has changed for `quiet_ms` with the kernel idle: what the browser
    sent back while a cell ran reaches the kernel only after the cell."""
    text, since = status.inner_text(), time.monotonic()
    while time.monotonic() - since < quiet_ms / 1000:
        page.wait_for_timeout(250)
        now = status.inner_text()
        if now != text or page.evaluate(KERNEL_STATUS) != "idle":
            text, since = now, time.monotonic()
    return text


@pytest.mark.slow  # ~50 s; the same messages without a browser: test_dashboard_sync.py
def test_the_dashboard_follows_cells_and_buttons_in_a_real_browser(lab):
    """Dashboard open; run; reset(again=True) and run; reset(again=True) and step; step; the
    Step and Run buttons: after each, the status shows the engine's last step of its last step
    (it used to stay at "step 0 of N" after the second run, and after every later cell)."""
    import nbformat
    from playwright.sync_api import sync_playwright

    base, lab_log = lab
    spec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    cells = [nbformat.v4.new_code_cell(source) for source in SEQUENCE]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": spec})
    nbformat.write(nb, lab_log.parent / "dashboard_sequence.ipynb")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 1100})
        page.goto(f"{base}/lab/tree/dashboard_sequence.ipynb?reset")
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        page.wait_for_function("window.jupyterapp !== undefined", timeout=60_000)
        _start_kernel(page, lab_log)
        _run_cell(page, lab_log, 0)
        status = page.locator(".jp-OutputArea-output .widget-html-content").first
        status.wait_for(timeout=60_000)
        seen = []
        for index in range(1, 5):
            last = int(_run_cell(page, lab_log, index).split()[-1])
            what = "; ".join(SEQUENCE[index].splitlines()[:-1])
            seen.append((what, last, _settled(page, status)))
        for name in ("Step", "Run"):
            before = status.inner_text()
            page.get_by_role("button", name=name, exact=True).first.click()
            page.wait_for_function(
                "([el, before]) => el.innerText !== before",
                arg=[status.element_handle(), before],
                timeout=60_000,
            )
            _settled(page, status)
            last = int(_run_cell(page, lab_log, 5).split()[-1])
            seen.append((f"the {name} button", last, _settled(page, status)))
        page.screenshot(path=str(ARTIFACTS / "dashboard-sequence.png"))
        browser.close()
    shown = [(what, last, " ".join(text.split()[:4])) for what, last, text in seen]
    assert all(text == f"step {last} of {last}" for _, last, text in shown), shown
    lasts = [last for _, last, _ in shown]
    assert lasts[0] == lasts[1] > 3 and lasts[2:5] == [0, 1, 2] and lasts[5] > 2, shown

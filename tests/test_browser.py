"""The quickstart notebook in a real JupyterLab, in a real (headless) Chromium: run all cells, press
Step in the dashboard, and check that the step counter advanced and the charts redrew.

Needs Debian's chromium (/usr/bin/chromium) and the Python package playwright; `make test` installs
both (the browser is never downloaded by playwright). Screenshots go to out/test-artifacts/.
"""

from __future__ import annotations

import os
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

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: `make test` installs it (apt-get install chromium)")
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "notebooks" / "01_quickstart.ipynb", root)
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
            "--LabApp.news_url=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "JUPYTER_PLATFORM_DIRS": "1"},
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
    yield base
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def test_quickstart_dashboard_steps_in_a_real_browser(lab):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.goto(f"{lab}/lab/tree/01_quickstart.ipynb?reset")
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        page.wait_for_function("window.jupyterapp !== undefined", timeout=60_000)
        # JupyterLab may ask which kernel to start (take the default it proposes) or just start it
        page.wait_for_selector(
            ".jp-Dialog, .jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000
        )
        select = page.locator(".jp-Dialog").get_by_role("button", name="Select", exact=True)
        if select.count():
            select.click()
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000
        )
        # start every cell (without waiting on the command's promise: progress is polled below)
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        no_news = page.get_by_role("button", name="No", exact=True)
        # the last cell adds a request: its output (a uid) is there, though maybe off screen
        last = page.locator(".jp-Cell").last
        try:
            last.locator(".jp-OutputArea-output").wait_for(state="attached", timeout=400_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "notebook-stuck.png"))
            raise
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000
        )
        errors = page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']"
        )
        assert errors.count() == 0, errors.first.inner_text()

        if no_news.count():  # JupyterLab asks about news once; the answer keeps screenshots clear
            no_news.first.click()
        status = page.locator(".jp-OutputArea-output .widget-html-content", has_text="step ").first
        status.scroll_into_view_if_needed()
        status.wait_for(timeout=60_000)
        dashboard = page.locator(
            ".jp-OutputArea-output", has=page.get_by_role("button", name="Step", exact=True)
        ).first
        charts = dashboard.locator(".vega-embed svg, .vega-embed canvas")
        assert charts.count() >= 8  # every chart drawn
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
        page.wait_for_timeout(1000)  # let vega finish drawing
        assert dashboard.locator(".vega-embed svg, .vega-embed canvas").count() >= 8
        assert dashboard.locator(".vega-embed").nth(1).inner_html() != before_chart
        assert errors.count() == 0
        dashboard.screenshot(path=str(ARTIFACTS / "dashboard-after-step.png"))
        # everything the page loaded came from the local JupyterLab (no CDN): the browser's
        # own record of every resource it fetched
        urls = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
        outside = [u for u in urls if not u.startswith((lab, "data:", "blob:"))]
        assert urls and not outside, f"loaded from the network: {outside[:5]}"
        page.screenshot(path=str(ARTIFACTS / "notebook.png"), full_page=False)
        browser.close()

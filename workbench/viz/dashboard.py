"""The live dashboard: buttons that drive the engine, a step slider to look back, a request picker
(with Abort for the picked request), and charts that redraw in place after every step.

    wb.dashboard()              # live, on a Workbench
    Dashboard(load_run(path))   # a saved run: the same views, no buttons

Charts are Altair `JupyterChart` widgets in offline mode (no CDN); assigning a new chart redraws
it in place. A step taken from a button or from `wb.step()` in another cell refreshes the views.
"""

from __future__ import annotations

import time
from typing import Any

import ipywidgets as w

from . import charts

RUN_WIDE = ("batch_composition", "kv_usage", "step_breakdown", "admissions", "ledger_lines")
PER_STEP = ("ledger_bars", "page_table", "kernel_timeline")
LAYOUT = (
    ("batch_composition", "ledger_bars"),
    ("kv_usage", "page_table"),
    ("step_breakdown", "kernel_timeline"),
    ("ledger_lines", "admissions"),
)
REFRESH_EVERY_S = 0.3  # during a long run, redraw at most this often
CHART_WIDTH = 400  # two charts side by side fit a notebook's output area


class Dashboard(w.VBox):
    def __init__(self, source: Any) -> None:
        import altair as alt

        alt.JupyterChart.enable_offline()
        self.workbench = source if hasattr(source, "scheduler") else None
        self.source = source
        self.status = w.HTML()
        self.slider = w.IntSlider(
            description="step",
            min=0,
            max=0,
            continuous_update=False,
            layout=w.Layout(width="420px"),
        )
        self.picker = w.Dropdown(description="request", options=[("all", -1)], value=-1)
        self.charts = {
            name: alt.JupyterChart(charts._empty(alt, "no steps yet"))
            for name in RUN_WIDE + PER_STEP
        }
        self.buttons: dict[str, w.Button] = {}
        rows: list[w.Widget] = []
        if self.workbench is not None:
            self.count = w.BoundedIntText(
                value=10, min=1, max=100_000, layout=w.Layout(width="80px")
            )
            for name, handler in (
                ("Step", lambda _: self._drive(1)),
                ("Step ×", lambda _: self._drive(self.count.value)),
                ("Run", lambda _: self._drive(None)),
                ("Reset", lambda _: self._reset()),
            ):
                button = w.Button(description=name, layout=w.Layout(width="80px"))
                button.on_click(handler)
                self.buttons[name] = button
            controls = [self.buttons["Step"], self.buttons["Step ×"], self.count]
            rows.append(w.HBox([*controls, self.buttons["Run"], self.buttons["Reset"]]))
            self.workbench._observers.append(self._on_engine_step)
        picking = [self.slider, self.picker]
        if self.workbench is not None:
            abort = w.Button(description="Abort", disabled=True, layout=w.Layout(width="80px"))
            abort.on_click(lambda _: self._abort())
            self.buttons["Abort"] = abort
            picking.append(abort)
        rows.append(w.HBox(picking))
        rows.append(self.status)
        for left, right in LAYOUT:
            rows.append(w.HBox([self.charts[left], self.charts[right]]))
        super().__init__(rows)
        self._follow = True  # the slider tracks the newest step until moved back by hand
        self._last_refresh = 0.0
        self.slider.observe(self._on_slider, "value")
        self.picker.observe(lambda _: self.refresh(), "value")
        self.refresh()

    @property
    def history(self):
        return self.workbench.history if self.workbench is not None else self.source

    # -- driving the engine -----------------------------------------------------------------
    def _drive(self, n: int | None) -> None:
        self._follow = True
        if n is None:
            self.workbench.run(progress=False)
        else:
            self.workbench.step(n)
        self.refresh()

    def _reset(self) -> None:
        self.workbench.reset()
        self._follow = True
        self.refresh()

    def _abort(self) -> None:
        """Abort the picked request (the next steps show its slot and pages freed)."""
        uid = self.picker.value
        if uid != -1 and uid not in self.workbench.scheduler.finished:
            self.workbench.abort(uid)
        self.refresh()

    def _on_engine_step(self, final: bool) -> None:
        if final or time.monotonic() - self._last_refresh >= REFRESH_EVERY_S:
            self.refresh()

    def _on_slider(self, change) -> None:
        self._follow = change["new"] == self.slider.max
        self.refresh()

    # -- drawing ----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Redraw every chart for the selected step and request."""
        self._last_refresh = time.monotonic()
        history = self.history
        steps = history.steps
        if steps.empty:
            self.status.value = "<i>no steps yet</i>"
            return
        last = int(steps.step.iloc[-1])
        with self.slider.hold_trait_notifications():
            self.slider.max = last
            self.slider.min = int(steps.step.iloc[0])
            if self._follow:
                self.slider.value = last
        uids = [int(u) for u in history.requests.uid]
        options = [("all", -1)] + [(f"#{u}", u) for u in uids]
        if [o[1] for o in self.picker.options] != [o[1] for o in options]:
            value = self.picker.value if self.picker.value in uids else -1
            self.picker.options, self.picker.value = options, value
        step = self.slider.value
        uid = None if self.picker.value == -1 else self.picker.value
        if "Abort" in self.buttons:  # only a request still waiting or running can be aborted
            self.buttons["Abort"].disabled = uid is None or uid in self.workbench.scheduler.finished
        self.status.value = self._status_html(step)
        drawn = {
            "batch_composition": charts.batch_composition(history, step),
            "kv_usage": charts.kv_usage(history, step),
            "step_breakdown": charts.step_breakdown(history, step),
            "admissions": charts.admissions(history, uid),
            "ledger_lines": charts.ledger_lines(history, uid, step),
            "ledger_bars": charts.ledger_bars(history, step, uid),
            "page_table": charts.page_table(history, step, uid),
            "kernel_timeline": charts.kernel_timeline(history, step),
        }
        for name, chart in drawn.items():
            self.charts[name].chart = chart.properties(width=CHART_WIDTH)

    def _status_html(self, step: int) -> str:
        row = self.history.steps.set_index("step").loc[step]
        waiting = (
            f" · waiting: {row.waiting_reasons}"
            if isinstance(row.waiting_reasons, str) and row.waiting_reasons
            else ""
        )
        return (
            f"<b>step {step}</b> of {int(self.slider.max)} · {row.phase} · "
            f"{int(row.batch_size)} requests · {int(row.num_tokens)} tokens · "
            f"queue {int(row.queue_len)} · running {int(row.running)} · "
            f"KV free {int(row.kv_free)}/{int(row.kv_total)}{waiting} · "
            f"{row.wall_ms:.1f} ms"
            + (f" (host {row.host_ms:.1f} ms)" if "host_ms" in row.index else "")
        )

    def close(self) -> None:
        if self.workbench is not None and self._on_engine_step in self.workbench._observers:
            self.workbench._observers.remove(self._on_engine_step)
        super().close()

"""The live dashboard: buttons that drive the engine, a step slider, a request picker (with
Abort), and charts that redraw in place after every step, wherever the step was taken.

    wb.dashboard()              # live, on a Workbench
    load_run(path).dashboard()  # a saved run: the same views, no buttons
"""

from __future__ import annotations

import time
from typing import Any

import ipywidgets as w
import pandas as pd

from ..timing import device_on_host
from . import charts
from .causes import counted, number
from .common import empty_chart, vega_offline

# During a run the views redraw only after the engine has stepped for REDRAW_RATIO times what
# the last redraw cost (at least REDRAW_MIN_S): redrawing then adds at most 1 / REDRAW_RATIO.
REDRAW_RATIO = 6.0
REDRAW_MIN_S = 0.2
# two charts side by side, legends below, fit a 1,000 px JupyterLab window with its side bar open
CHART_WIDTH = 330


class Dashboard(w.VBox):
    """The views of a live Workbench (with buttons) or of a saved run (`source`)."""

    def __init__(self, source: Any) -> None:
        import altair as alt

        if vega_offline():
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
            chart.name: alt.JupyterChart(empty_chart(alt, "no steps yet"))
            for chart in charts.CHARTS
            if chart.applies(self.history)
        }
        self.buttons: dict[str, w.Button] = {}
        rows: list[w.Widget] = []
        if self.workbench is not None:
            rows.append(self._engine_buttons())
            self._unobserve = self.workbench.observe(self._on_engine_step)
        picking = [self.slider, self.picker]
        if self.workbench is not None:
            abort = w.Button(description="Abort", disabled=True, layout=w.Layout(width="80px"))
            abort.on_click(lambda _: self._abort())
            self.buttons["Abort"] = abort
            picking.append(abort)
        rows.append(w.HBox(picking))
        rows.append(self.status)
        for names in _layout([c for c in charts.CHARTS if c.name in self.charts]):
            row = w.HBox([self.charts[name] for name in names])
            row.layout.flex_flow = "row wrap"
            rows.append(row)
        super().__init__(rows)
        self._follow = True  # the slider tracks the newest step until moved back by hand
        self._moving = False  # the slider or the picker is being set by refresh(), not by hand
        self._last_refresh = 0.0
        self._redraw_s = 0.0
        self._cleared = True  # the charts show "no steps yet"
        self._progress = ""
        self._progress_of: tuple[int, int | None] | None = None  # (first step, steps asked)
        self.slider.observe(self._on_slider, "value")
        self.picker.observe(lambda _: None if self._moving else self.refresh(), "value")
        self.refresh()

    def _engine_buttons(self) -> w.HBox:
        self.count = w.BoundedIntText(value=10, min=1, max=100_000, layout=w.Layout(width="80px"))
        for name, handler in (
            ("Step", lambda _: self._drive(1)),
            ("Step ×", lambda _: self._drive(self.count.value)),
            ("Run", lambda _: self._drive(None)),
            ("Reset", lambda _: self._reset(again=False)),
            ("Again", lambda _: self._reset(again=True)),
        ):
            button = w.Button(description=name, layout=w.Layout(width="80px"))
            button.on_click(handler)
            self.buttons[name] = button
        self.buttons["Reset"].tooltip = "drop every request and the history"
        controls = [self.buttons["Step"], self.buttons["Step ×"], self.count]
        return w.HBox(
            [*controls, self.buttons["Run"], self.buttons["Reset"], self.buttons["Again"]]
        )

    @property
    def history(self):
        return self.workbench.history if self.workbench is not None else self.source

    def _drive(self, n: int | None) -> None:
        """Step n times (None: to the end); the views follow as it goes, throttled."""
        self._follow = True
        first = self.workbench.step_index
        self._progress_of = (first, n)
        try:  # the workbench notifies the views after the last step: no redraw here
            if n == 1:
                self.workbench.step()
            else:
                self.workbench.run(max_steps=n, progress=False)
        except Exception as exc:  # a button has no cell to show it in: the status line does
            self._show_error(exc)
        finally:
            self._progress_of = None

    def _show_error(self, exc: Exception) -> None:
        import html

        message = html.escape(f"{type(exc).__name__}: {exc}")
        self.status.value = f'<b style="color:#b00020">{message}</b>'

    def _reset(self, again: bool) -> None:
        self._follow = True
        self.workbench.reset(again=again)  # notifies the views

    def _abort(self) -> None:
        """Abort the picked request (the next steps show its slot and pages freed)."""
        uid = self.picker.value
        if uid != -1 and uid not in self.workbench.scheduler.finished:
            self.workbench.abort(uid)  # notifies the views

    def _on_engine_step(self, final: bool) -> None:
        self._progress = ""
        if self._progress_of is not None and not final:
            first, n = self._progress_of
            done = self.workbench.step_index - first
            self._progress = (
                f"running: {number(done)} of {counted(n, 'step')} · "
                if n
                else f"running: {counted(done, 'step')} · "
            )
        wait = max(REDRAW_MIN_S, REDRAW_RATIO * self._redraw_s)
        if final or time.monotonic() - self._last_refresh >= wait:
            self.refresh()
            return
        self._update_buttons()  # cheap: what can be pressed follows every change
        if self._progress:  # between redraws, at least the count moves
            self.status.value = f"<b>{self._progress}</b><i>the views redraw as it goes</i>"
        elif len(self.history) == 0:  # NOTE: not history.steps, a table built again each step
            self._clear()

    def _on_slider(self, change) -> None:
        if self._moving:
            return
        self._follow = change["new"] == self.slider.max
        self.refresh()

    def _update_buttons(self) -> None:
        """Buttons that cannot act now are disabled, and say why."""
        if self.workbench is None:
            return
        idle = self.workbench.is_done
        why = "nothing is waiting or running: add requests (wb.add_request) or press Again"
        for name in ("Step", "Step ×", "Run"):
            self.buttons[name].disabled = idle
            self.buttons[name].tooltip = why if idle else ""
        count = self.workbench.submitted_count
        again = self.buttons["Again"]
        again.disabled = count == 0
        again.tooltip = (
            f"reset, then add the same {count} requests again" if count else "no requests to repeat"
        )
        uid = None if self.picker.value == -1 else self.picker.value
        abort = self.buttons["Abort"]
        abort.disabled = uid is None or uid in self.workbench.scheduler.finished
        abort.tooltip = (
            "pick a request first"
            if uid is None
            else f"#{uid} has finished"
            if abort.disabled
            else f"abort #{uid} and free what it holds"
        )

    def refresh(self) -> None:
        """Redraw every chart for the selected step and request."""
        start = time.monotonic()
        try:
            self._redraw()
        finally:
            self._last_refresh = time.monotonic()
            if not self._cleared:  # emptied views cost nothing: keep the last drawing's cost
                self._redraw_s = self._last_refresh - start

    def _redraw(self) -> None:
        history = self.history
        steps = history.steps
        self._update_buttons()
        if steps.empty:
            self._clear()
            return
        last = int(steps.step.iloc[-1])
        follow = self._follow or not steps.step.iloc[0] <= self.slider.value <= last
        self._set_slider(int(steps.step.iloc[0]), last, last if follow else self.slider.value)
        uids = [int(u) for u in history.requests.uid]
        options = [("all", -1)] + [(f"#{u}", u) for u in uids]
        if [o[1] for o in self.picker.options] != [o[1] for o in options]:
            self._set_picker(options, self.picker.value if self.picker.value in uids else -1)
        self._update_buttons()
        step = self.slider.value
        uid = None if self.picker.value == -1 else self.picker.value
        self.status.value = self._progress + self._status_html(step)
        for chart in charts.CHARTS:
            if chart.name in self.charts:
                self.charts[chart.name].chart = _fit(chart.draw(history, step, uid))
        self._cleared = False

    def _set_slider(self, low: int, high: int, value: int) -> None:
        """The slider's range and value, set by the dashboard (not a move by hand)."""
        self._moving = True
        try:
            # NOTE: one message for all three: sent apart, the browser clamps its old value into
            # the new range and sends it back, which reads as a move by hand and stops following.
            with self.slider.hold_sync(), self.slider.hold_trait_notifications():
                self.slider.min, self.slider.max, self.slider.value = low, high, value
        finally:
            self._moving = False

    def _set_picker(self, options: list[tuple[str, int]], value: int) -> None:
        """The picker's choices in one message, with no redraw of their own (the caller draws)."""
        self._moving = True
        try:
            with self.picker.hold_sync():
                self.picker.options, self.picker.value = options, value
        finally:
            self._moving = False

    def _clear(self) -> None:
        """No steps (a new or reset workbench): empty views, and what to do next."""
        import altair as alt

        self._follow = True  # a new history (a reset from a cell too) shows its newest step
        self._set_slider(0, 0, 0)
        if len(self.picker.options) > 1:
            self._set_picker([("all", -1)], -1)
        self._update_buttons()
        if not self._cleared:
            empty = empty_chart(alt, "no steps yet")
            for view in self.charts.values():
                view.chart = empty
            self._cleared = True
        if self.workbench is None:
            self.status.value = "<i>this run has no steps</i>"
        elif not self.workbench.is_done:
            self.status.value = "<i>no steps yet: press Step or Run</i>"
        else:
            count = self.workbench.submitted_count
            again = f", or press Again to run the same {count} requests" if count else ""
            self.status.value = (
                f"<i>no steps yet and nothing queued: add requests with wb.add_request(...)"
                f"{again}</i>"
            )

    def _status_html(self, step: int) -> str:
        row = self.history.steps.set_index("step").loc[step]
        waiting = (
            f" · waiting: {row.waiting_reasons.replace(',', ', ')}"
            if isinstance(row.waiting_reasons, str) and row.waiting_reasons
            else ""
        )
        return (
            f"<b>step {step}</b> of {int(self.slider.max)} · {row.phase} · "
            f"{counted(int(row.batch_size), 'request')} · "
            f"{counted(int(row.num_tokens), 'token')} · "
            f"queue {int(row.queue_len)} · running {int(row.running)} · "
            f"KV free {int(row.kv_free)}/{int(row.kv_total)}{waiting} · "
            f"{_experts(row)}"
            f"{_times(row, device_on_host(self.history))}"
            f"{_host_bound(row, self.history.steps)}"
            + (" · <i>simulated: predicted times</i>" if row.get("simulated", False) else "")
        )

    def close(self) -> None:
        if self.workbench is not None:
            self._unobserve()
        super().close()


def _layout(charts: list) -> list[tuple[str, ...]]:
    """The charts two by two in their registry's order, a wide one in a row of its own."""
    rows: list[tuple[str, ...]] = []
    pair: list[str] = []
    for chart in charts:
        if chart.wide:
            rows += [tuple(pair)] if pair else []
            rows.append((chart.name,))
            pair = []
            continue
        pair.append(chart.name)
        if len(pair) == 2:
            rows.append(tuple(pair))
            pair = []
    return rows + ([tuple(pair)] if pair else [])


def _fit(chart):
    """A chart at the dashboard's width, its legend below it (so a pair fits side by side)."""
    return chart.properties(width=CHART_WIDTH).configure_legend(
        orient="bottom", direction="horizontal", columns=4, titleOrient="left"
    )


def _times(row, on_host: bool) -> str:
    """ "8.2 ms wall: device 6.1, host's own work 1.9" (`workbench.timing`)."""
    said = f"{row.wall_ms:.1f} ms wall"
    if "host_work_ms" not in row.index or pd.isna(row.host_work_ms):
        return said
    device = "forward and sampling (CPU)" if on_host else "device"
    return said + f": {device} {row.device_ms:.1f}, host's own work {row.host_work_ms:.1f}"


def _experts(row) -> str:
    """An MoE model's step: "experts touched 7.5 per MoE layer · " (`history/routing.py`)."""
    touched = row.get("experts_touched")
    if touched is None or pd.isna(touched):
        return ""
    return f"experts touched {touched:.1f} per MoE layer · "


def _host_bound(row, steps) -> str:
    """Whether the step was host-bound, and how many of the run's were (as the chart's title)."""
    if "host_bound" not in steps or pd.isna(row.get("host_bound")):
        return ""
    here = "<b>this step</b>" if bool(row.host_bound) else "not this step"
    count = int(steps.host_bound.fillna(False).astype(bool).sum())
    return f" · host-bound: {here}; {number(count)} of {counted(len(steps), 'step')} in the run"

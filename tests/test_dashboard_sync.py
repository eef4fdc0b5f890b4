"""The dashboard follows the engine whatever the order of cells and buttons, and whatever the
browser's copy of its widgets sends back meanwhile (a model of the browser's step slider here;
tests/test_browser.py drives the same sequence in a real JupyterLab)."""

from __future__ import annotations

import re

from workbench import Workbench

from .conftest import PROMPTS, greedy


class BrowserSlider:
    """The browser's side of the dashboard's step slider, as ipywidgets' IntSliderView has it:
    each message's state is applied at once, then a value outside [min, max] is clamped and sent
    back to the kernel, where it waits until the cell that runs meanwhile ends."""

    def __init__(self, slider) -> None:
        self.slider = slider
        self.state = {key: getattr(slider, key) for key in ("min", "max", "value")}
        self.sent: list[int] = []
        slider.comm.send = self.receive

    def receive(self, data=None, metadata=None, buffers=None) -> None:
        self.state |= {k: v for k, v in data["state"].items() if k in self.state}
        clamped = min(max(self.state["value"], self.state["min"]), self.state["max"])
        if clamped != self.state["value"]:
            self.state["value"] = clamped
            self.sent.append(clamped)

    def cell_ends(self) -> None:
        """The kernel, idle again, reads what the browser sent while the cell ran."""
        for value in self.sent:
            self.slider.set_state({"value": value})
        self.sent.clear()


def shown(dash) -> tuple[int, int]:
    """(step, last step) in the dashboard's status line."""
    found = re.search(r"<b>step (\d+)</b> of (\d+)", dash.status.value)
    return (int(found[1]), int(found[2])) if found else (-1, -1)


def test_the_dashboard_follows_cells_and_buttons_whatever_the_browser_sends_back():
    """Run, reset(again=True) and run, step, step, a button: after each the status shows the
    engine's last step, the browser's slider included (it never has to clamp a value and send
    it back, which arrived after the cell as a move by hand to step 0). A move by hand back to
    an old step is kept until a reset from a cell, after which the dashboard follows again."""
    wb = Workbench("tiny-llama", record="light", max_extend_tokens=8, max_running_reqs=2)
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(4))
    dash = wb.dashboard()
    browser = BrowserSlider(dash.slider)
    cells = [
        lambda: wb.run(progress=False),
        lambda: (wb.reset(again=True), wb.run(progress=False)),
        lambda: (wb.reset(again=True), wb.step()),
        wb.step,
        wb.step,
        dash.buttons["Step"].click,
        lambda: browser.slider.set_state({"value": 0}),  # the user looks back at step 0
        dash.buttons["Step"].click,  # a button follows the engine again
        lambda: browser.slider.set_state({"value": 1}),
        lambda: (wb.reset(again=True), wb.step(2)),  # and so does a reset from a cell
    ]
    for i, cell in enumerate(cells):
        cell()
        browser.cell_ends()
        last = int(wb.history.steps.step.iloc[-1])
        expected = (0, last) if i == 6 else (1, last) if i == 8 else (last, last)
        assert shown(dash) == expected, f"after cell {i}"
        assert browser.state["value"] == dash.slider.value and browser.state["max"] == last
    assert not browser.sent
    dash.close()

"""A workbench's views while it serves: the engine's thread only pokes this thread after a step (a
redraw is slow), and pokes that come while it draws make one redraw, not many."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("workbench.serve")


class ViewThread:
    def __init__(self, notify: Callable[[bool], None]) -> None:
        self._notify = notify
        self._poked = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="workbench-views", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """The engine stepped: the views redraw when this thread gets to it."""
        self._poked.set()

    def stop(self) -> None:
        self._stopping = True
        self._poked.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            self._poked.wait()
            self._poked.clear()
            if self._stopping:
                return
            try:
                self._notify(False)
            except Exception:  # a view that fails must not stop the others, nor the engine
                log.exception("a view failed to follow the engine")

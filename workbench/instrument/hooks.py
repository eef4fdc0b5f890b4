"""Named hook points: observe the engine without touching it.

The names are the same strings as the `torch.profiler.record_function` ranges, so a hook and a
profiler trace speak one vocabulary. A hook gets a small frozen event of CPU values (see
`events.py`). With nothing registered for a name, the engine pays one dictionary look-up.

A hook that raises never leaves the engine half-stepped: the error is kept, the step runs to its
end (the other hooks still run), and then `HookError` is raised from the step, chained to the
first error. The step's record is already in the history by then, and the hook stays registered
(remove it with its handle).

Order within one step (`request.arrive` fires when a request is added, outside any step):
``cache.match`` for each waiting request tried, ``admit`` / ``reject`` in queue order,
``schedule.end``, ``cache.evict`` if allocating pages evicted cached KV, ``batch.prepared``,
``forward.begin``, ``forward.end``, ``cache.insert`` for each prompt prefix shared by a prefill
batch, ``sample.end``, ``request.finish`` for each request that ended, ``cache.insert`` for each
finished request's KV, ``step.end``. With overlap, the launch half (up to the first
``cache.insert``) of step N+1 runs before the collect half (from ``sample.end``) of step N.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator, Mapping
from typing import Any

HOOK_POINTS = (
    "request.arrive",  # a request entered the waiting queue
    "cache.match",  # a waiting request was matched against the prefix cache
    "admit",  # a waiting request was admitted into a prefill batch
    "reject",  # ... or was not, with the name of the check that refused it
    "schedule.end",  # the batch is chosen
    "cache.insert",  # computed KV was offered to the prefix cache
    "cache.evict",  # cached KV was dropped to make room
    "batch.prepared",  # KV pages allocated, inputs and attention metadata built
    "forward.begin",  # the forward is about to be launched
    "forward.end",  # the forward (and sampling) is launched; device-side ledgers moved
    "sample.end",  # the sampled tokens reached the host
    "request.finish",  # a request produced its last token
    "step.end",  # the step is over; the event is its StepRecord
)

Hook = Callable[[Any], None]
OUTSIDE = frozenset({"request.arrive", "step.end"})  # hook points not inside a step


class HookError(RuntimeError):
    """A hook raised; the step it ran in completed, and this was raised at its end."""


class HookHandle:
    def __init__(self, registry: HookRegistry, names: list[str], fn: Hook) -> None:
        self._registry, self.names, self.fn = registry, names, fn

    def remove(self) -> None:
        self._registry._remove(self.names, self.fn)

    def __repr__(self) -> str:
        return f"HookHandle({self.fn!r} on {self.names})"


class HookRegistry:
    def __init__(self) -> None:
        self._listeners: dict[str, list[Hook]] = {}  # only names with at least one hook
        self.errors: list[tuple[str, Hook, BaseException]] = []  # raised after the step
        self.inside = False  # a hook listens on a point inside a step
        self.at_end = False  # a hook listens on "step.end"
        self.on_change: Callable[[], None] | None = None  # told when hooks come and go

    def _changed(self) -> None:
        self.inside = any(name not in OUTSIDE for name in self._listeners)
        self.at_end = "step.end" in self._listeners
        if self.on_change is not None:
            self.on_change()

    def add(self, pattern: str, fn: Hook) -> HookHandle:
        """Call `fn(event)` at every hook point matching `pattern` (a name or a glob: "cache.*")."""
        names = fnmatch.filter(HOOK_POINTS, pattern)
        if not names:
            raise ValueError(f"no hook point matches {pattern!r}; hook points: {HOOK_POINTS}")
        for name in names:
            self._listeners.setdefault(name, []).append(fn)
        self._changed()
        return HookHandle(self, names, fn)

    @contextlib.contextmanager
    def scoped(self, hooks: Mapping[str, Hook]) -> Iterator[list[HookHandle]]:
        """Register hooks for the duration of a `with` block; removed on exit, also on error."""
        handles = [self.add(pattern, fn) for pattern, fn in hooks.items()]
        try:
            yield handles
        finally:
            for handle in handles:
                handle.remove()

    def _remove(self, names: list[str], fn: Hook) -> None:
        for name in names:
            listeners = self._listeners.get(name, [])
            if fn in listeners:
                listeners.remove(fn)
            if not listeners:
                self._listeners.pop(name, None)
        self._changed()

    def clear(self) -> None:
        self._listeners.clear()
        self._changed()

    def __contains__(self, name: str) -> bool:
        return name in self._listeners

    def emit(self, name: str, event: Any) -> None:
        for fn in list(self._listeners.get(name, ())):
            try:
                fn(event)
            except Exception as exc:  # noqa: BLE001 (kept, re-raised at the end of the step)
                self.defer(name, fn, exc)

    def defer(self, name: str, fn: Callable, exc: BaseException) -> None:
        """Keep an error that `fn` raised for `name` (a hook point, or `profile_steps`): it is
        raised after the step, as a hook's is (`raise_pending`)."""
        self.errors.append((name, fn, exc))

    def raise_pending(self) -> None:
        """Raise HookError for the hook errors of the step that just ended (if any)."""
        if not self.errors:
            return
        errors, self.errors = self.errors, []
        name, fn, first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise HookError(f"hook {fn!r} on {name!r} raised {first!r}{more}") from first

    def clear_pending(self) -> None:
        """Forget hook errors not raised yet (a call that failed for another reason)."""
        self.errors.clear()

    def __repr__(self) -> str:
        hooks = {name: len(fns) for name, fns in self._listeners.items()}
        return f"HookRegistry({hooks})"

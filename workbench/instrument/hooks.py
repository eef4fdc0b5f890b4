"""Named hook points: observe the engine without touching it.

The names are the profiler's range names; a hook gets a frozen event of CPU values (`events.py`).
A hook that raises does not stop its step: `HookError` is raised at the step's end.
Order in a step: cache.match, admit / reject, schedule.end, cache.evict, batch.prepared,
forward.begin, forward.end, cache.insert (shared prompts), sample.end, moe.route (an MoE
model's), request.finish, cache.insert (finished requests), step.end. With overlap, step N+1's
launch half runs before step N's collect half (from sample.end).
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .. import validate as V

HOOK_POINTS = (
    "request.arrive",  # outside any step
    "cache.match",
    "admit",
    "reject",  # with the name of the check that refused it
    "schedule.end",
    "cache.insert",
    "cache.evict",
    "batch.prepared",  # KV pages allocated, inputs and attention metadata built
    "forward.begin",
    "forward.end",  # launched, not finished
    "sample.end",
    "moe.route",  # an MoE model's: the tokens each expert received, per MoE layer
    "request.finish",
    "step.end",  # the event is the StepRecord
)

Hook = Callable[[Any], None]
OUTSIDE = frozenset({"request.arrive", "step.end"})


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
        self._listeners: dict[str, list[Hook]] = {}  # NOTE: only names with a hook
        self.errors: list[tuple[str, Hook, BaseException]] = []  # raised after the step
        self.inside = False
        self.at_end = False
        self.on_change: Callable[[], None] | None = None

    def _changed(self) -> None:
        self.inside = any(name not in OUTSIDE for name in self._listeners)
        self.at_end = "step.end" in self._listeners
        if self.on_change is not None:
            self.on_change()

    def add(self, pattern: str, fn: Hook) -> HookHandle:
        """Call `fn(event)` at every hook point matching `pattern` (a name or a glob: "cache.*")."""
        if not isinstance(pattern, str):
            raise TypeError(
                f"pattern must be a hook point's name or a glob of them, got {pattern!r}; "
                f"hook points: {HOOK_POINTS}"
            )
        V.function_of_one("fn", fn, "the hook point's event")
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
        V.mapping("hooks", hooks)  # {pattern: fn}
        handles = []
        try:
            for pattern, fn in hooks.items():
                handles.append(self.add(pattern, fn))
        except BaseException:  # (a bad one: none of them stays)
            for handle in handles:
                handle.remove()
            raise
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
        """Keep an error `fn` raised for `name`, to raise after the step (`raise_pending`)."""
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
        """Forget hook errors not raised yet."""
        self.errors.clear()

    def __repr__(self) -> str:
        hooks = {name: len(fns) for name, fns in self._listeners.items()}
        return f"HookRegistry({hooks})"

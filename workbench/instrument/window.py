"""Which steps record="full" profiles: the profile window.

`profile_steps` is None (every step), step indices, or a predicate of a `StepView`, as a function
or as text (`StepExpression`). NOTE: a predicate sees the scheduled batch, so the step it chooses
is profiled from its prepare on (its schedule too only if the step before was profiled).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from .. import validate as V

if TYPE_CHECKING:
    from ..core import Batch
    from ..scheduler.record import Occupancy

KEEP: Any = object()  # keep the current value


@dataclass(frozen=True)
class StepView:
    """The step about to run, as a `profile_steps` predicate sees it (scheduled, not prepared)."""

    step: int
    phase: str  # "prefill" | "decode" | "mixed"
    batch_size: int
    num_tokens: int
    prefill_tokens: int  # chunks included
    decode_batch: int
    queue_len: int  # still waiting once it is admitted
    kv_usage: float  # share of the KV pool held, before its new tokens (0 to 1)

    @classmethod
    def of(cls, step: int, batch: Batch, occupancy: Occupancy) -> StepView:
        prefill = sum(r.extend_len for r in batch.prefill_reqs)
        o = occupancy
        in_use = o.kv_total - o.kv_free - o.kv_evictable
        return cls(
            step=step,
            phase=batch.phase,
            batch_size=batch.size,
            num_tokens=prefill + batch.num_decode,
            prefill_tokens=prefill,
            decode_batch=batch.num_decode,
            queue_len=o.queue_len,
            kv_usage=in_use / o.kv_total if o.kv_total else 0.0,
        )


FIELDS = tuple(f.name for f in fields(StepView))
# made-up steps of each phase, to call a predicate on before the run: each branch of an `and`
# or `or` (phase == "mixed" and ...) meets one that reaches it
_SAMPLES = (
    StepView(0, "decode", 1, 1, 0, 1, 0, 0.0),
    StepView(1, "prefill", 1, 512, 512, 0, 3, 0.25),
    StepView(2, "mixed", 8, 263, 256, 7, 1, 0.5),
    StepView(3, "decode", 64, 64, 0, 64, 0, 0.75),
)
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
STEP_PHASES = ("prefill", "decode", "mixed")  # StepView.phase's values


class StepExpression:
    """A `StepView` predicate as text, e.g. ``"phase == 'mixed' and batch_size >= 64"``; only
    fields, constants, comparisons and and/or/not are allowed, so a command line may give it."""

    def __init__(self, text: str, name: str = "profile_steps") -> None:
        if not isinstance(text, str):
            raise TypeError(f"{name} must be an expression over {FIELDS}, got {text!r}")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise ValueError(f"{name}: {text!r} is not an expression ({exc.msg})") from None
        for node in ast.walk(tree):
            _check_node(node, text, name)
        self.text, self.name = text.strip(), name
        self._code = compile(tree, f"<{name}>", "eval")
        _try_predicate(self, name)

    def __call__(self, view: StepView) -> bool:
        return bool(eval(self._code, {"__builtins__": {}}, vars(view)))  # noqa: S307 (checked)

    def __repr__(self) -> str:
        return f"StepExpression({self.text!r})"


def _check_node(node: ast.AST, text: str, name: str) -> None:
    allowed = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.Compare, ast.Load, ast.Not)
    if isinstance(node, ast.Name):
        if node.id not in FIELDS:
            raise ValueError(f"{name}: unknown name {node.id!r} in {text!r}; the fields: {FIELDS}")
    elif isinstance(node, ast.Constant):
        if not isinstance(node.value, int | float | str):
            raise ValueError(f"{name}: constant {node.value!r} in {text!r} is not allowed")
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, ast.Not):
            raise ValueError(f"{name}: only `not` is allowed before a term, in {text!r}")
    elif isinstance(node, ast.Compare):
        terms = [node.left, *node.comparators]
        for a, b in zip(terms, terms[1:], strict=False):
            _check_comparison(a, b, text, name)
            _check_comparison(b, a, text, name)
    elif not isinstance(node, allowed + _COMPARISONS):
        raise ValueError(
            f"{name}: {type(node).__name__} is not allowed in {text!r}: only the fields "
            f"{FIELDS}, constants, comparisons, and, or, not"
        )


def _check_comparison(field: ast.AST, constant: ast.AST, text: str, name: str) -> None:
    """`phase` compared with a name no phase has (`phase == 'mixd'`) would choose no step,
    silently: refused. (A comparison of the wrong types fails on the made-up steps.)"""
    phase = isinstance(field, ast.Name) and field.id == "phase"
    value = constant.value if isinstance(constant, ast.Constant) else None
    if phase and isinstance(value, str) and value not in STEP_PHASES:
        raise ValueError(
            f"{name}: phase is one of {STEP_PHASES}, compared with {value!r} in {text!r}"
        )


@dataclass(frozen=True)
class ProfileWindow:
    steps: Collection[int] | Callable[[StepView], Any] | None = None
    max_steps: int | None = None
    text: str = "every step"  # what the saved run says chose its profiled steps

    @property
    def by_predicate(self) -> bool:
        return callable(self.steps)

    def covers(self, index: int) -> bool:
        return not self.by_predicate and (self.steps is None or index in self.steps)

    def meta(self) -> dict:
        return {"profile_steps": self.text, "max_profiled_steps": self.max_steps}

    def with_(self, steps: Any = KEEP, max_steps: Any = KEEP) -> ProfileWindow:
        """This window with another `profile_steps` or `max_profiled_steps`."""
        if steps is KEEP and max_steps is KEEP:
            return self
        return profile_window(
            self.steps if steps is KEEP else steps,
            self.max_steps if max_steps is KEEP else max_steps,
        )


def profile_window(steps: Any = None, max_steps: int | None = None) -> ProfileWindow:
    """A checked window; raises TypeError or ValueError before anything runs."""
    max_steps = V.optional_integer("max_profiled_steps", max_steps, 1)
    if isinstance(steps, ProfileWindow):
        return steps if max_steps is None else ProfileWindow(steps.steps, max_steps, steps.text)
    if isinstance(steps, range) and (steps.start < 0 or steps.step < 0 or not steps):
        raise ValueError(
            f"profile_steps={steps!r} chooses no step (indices count up from 0): give a "
            "non-empty range of indices >= 0, e.g. range(100, 120)"
        )
    if steps is None or isinstance(steps, range):
        return ProfileWindow(steps, max_steps, "every step" if steps is None else repr(steps))
    if isinstance(steps, str):
        steps = StepExpression(steps)
    if callable(steps):
        if not isinstance(steps, StepExpression):
            _try_predicate(steps)
        return ProfileWindow(steps, max_steps, predicate_text(steps))
    if isinstance(steps, int | bytes) or not hasattr(steps, "__iter__"):
        raise TypeError(
            "profile_steps must be None (every step), a range (e.g. range(100, 120), or "
            "range(0, 10**9, 10) for every 10th step), a collection of step indices, or a "
            f"predicate of the step about to run (a function of a StepView, or the text of "
            f"one over {FIELDS}), got {steps!r}"
        )
    chosen = frozenset(V.integer("profile_steps item", s, 0) for s in steps)
    return ProfileWindow(chosen, max_steps, f"steps {sorted(chosen)}")


def _try_predicate(predicate: Callable, name: str = "profile_steps") -> None:
    """Call it on made-up steps, so a wrong signature or field fails before the run."""
    for sample in _SAMPLES:
        try:
            predicate(sample)
        except (AttributeError, NameError, TypeError) as exc:
            raise TypeError(
                f"{name}: {predicate_text(predicate)} failed on a StepView ({exc}); it takes one "
                f"StepView, whose fields are {FIELDS}"
            ) from exc
        except Exception:  # noqa: BLE001 (a value this made-up step has and no real one may)
            pass


def predicate_text(predicate: Callable) -> str:
    """An expression's text, a lambda's source, or the function's name."""
    if isinstance(predicate, StepExpression):
        return predicate.text
    name = getattr(predicate, "__qualname__", repr(predicate))
    try:
        source = inspect.getsource(predicate)
    except (OSError, TypeError):
        return name
    lambda_ = getattr(predicate, "__name__", "") == "<lambda>"
    start = source.find("lambda") if lambda_ else -1
    source = source[: start + 1000]
    # NOTE: its source lines hold more than the lambda: take the longest text that parses as one
    for end in range(len(source), start, -1) if start >= 0 else ():
        try:
            tree = ast.parse(source[start:end].strip(), mode="eval")
        except SyntaxError:
            continue
        if isinstance(tree.body, ast.Lambda):
            return " ".join(source[start:end].split())
    return name


class ChosenSteps:
    """The steps a window chose in one run, and those not recorded yet."""

    def __init__(self, window: ProfileWindow) -> None:
        self.window, self.count = window, 0
        self.awaiting: set[int] = set()

    @property
    def capped(self) -> bool:
        return self.window.max_steps is not None and self.count >= self.window.max_steps

    def wanted_at(self, index: int) -> bool | None:
        """Whether a session runs for step `index`; None when a predicate decides later."""
        self.awaiting = {i for i in self.awaiting if i >= index - 1}
        if self.awaiting or (self.window.covers(index) and not self.capped):
            return True
        return None if self.window.by_predicate else False

    def choose(self, step: int, view: Callable[[], StepView], defer: Callable) -> bool:
        """Whether the step just scheduled is profiled; a predicate's error goes to `defer`."""
        if self.capped:
            return False
        window = self.window
        if not window.by_predicate:
            chosen = window.covers(step)
        else:
            try:
                chosen = bool(window.steps(view()))
            except Exception as exc:  # noqa: BLE001 (raised after the step)
                defer("profile_steps", window.steps, exc)
                chosen = False
        if chosen:
            self.count += 1
            self.awaiting.add(step)
        return chosen

    def recorded(self, step: int) -> bool:
        if step not in self.awaiting:
            return False
        self.awaiting.discard(step)
        return True

"""Charts of an MoE model's routing (`history/routing.py`): the tokens each expert of each MoE
layer received at the step in focus, and the experts each step touched."""

from __future__ import annotations

import numpy as np

from .common import WIDTH, altair, binned_bar, binned_steps, chart_function, empty_chart, with_rule

_DENSE = "a dense model: its steps route no tokens to experts"


def has_routing(history) -> bool:
    """Whether the run is an MoE model's: a live history's roofline says so before any step, a
    saved run's steps table counts the experts touched."""
    roofline = getattr(history, "roofline", None)
    if roofline is not None and roofline.expert_params:
        return True
    steps = history.steps
    return "experts_touched" in steps and bool(steps.experts_touched.notna().any())


@chart_function
def expert_load(history, step: int):
    """At one step, the tokens each expert received in each MoE layer (blank: none)."""
    alt = altair()
    if not has_routing(history):
        return empty_chart(alt, _DENSE)
    routing = history.routing
    rows = routing[routing.step == step].astype("int64")
    if rows.empty:
        return empty_chart(alt, f"step {step}: no routing recorded")
    experts = int(routing.expert.max()) + 1  # of the run: the same axis at every step
    layers = sorted(routing.layer.unique().tolist())
    touched = rows.groupby("layer").size().reindex(layers, fill_value=0)
    title = [
        f"Tokens per expert at step {step}",
        f"{touched.mean():.1f} experts touched per MoE layer (mean), "
        f"{int(rows.tokens.max())} tokens at most in one",
    ]
    return (
        alt.Chart(rows)
        .mark_rect()
        .encode(
            x=alt.X(
                "expert:O",
                title="expert",
                scale=alt.Scale(domain=list(range(experts))),
                axis=alt.Axis(labels=experts <= 32, ticks=experts <= 32),
            ),
            y=alt.Y("layer:O", title="decoder layer", scale=alt.Scale(domain=layers)),
            color=alt.Color("tokens:Q", title="tokens", scale=alt.Scale(scheme="blues")),
            tooltip=["layer:O", "expert:O", "tokens:Q"],
        )
        .properties(width=WIDTH, height=max(60, min(12 * len(layers), 360)), title=title)
    )


@chart_function
def experts_touched(history, highlight_step: int | None = None):
    """Per step, the experts touched (mean over MoE layers) and the most loaded one's tokens
    over the mean per expert (`expert_imbalance`), in the tooltip."""
    alt = altair()
    if not has_routing(history):
        return empty_chart(alt, _DENSE)
    cols = ["experts_touched", "expert_imbalance", "num_tokens"]
    frame, x_title = binned_steps(history.steps, cols)
    chart = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            **binned_bar(alt, x_title),
            y=alt.Y("experts_touched:Q", title="experts touched per MoE layer"),
            tooltip=[
                alt.Tooltip("bin:Q", title="step"),
                alt.Tooltip("num_tokens:Q", title="tokens"),
                alt.Tooltip("experts_touched:Q", format=".1f", title="experts touched"),
                alt.Tooltip("expert_imbalance:Q", format=".2f", title="max / mean tokens"),
            ],
        )
    )
    decode = history.steps[history.steps.phase == "decode"].experts_touched
    title = ["Experts touched per step (mean over MoE layers)"]
    if len(decode) and not np.isnan(decode.mean()):
        title.append(f"decode steps: {decode.mean():.1f} on average")
    return with_rule(alt, chart, highlight_step).properties(width=WIDTH, height=140, title=title)

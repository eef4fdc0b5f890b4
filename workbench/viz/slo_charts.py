"""Why requests missed their SLOs: each missed request's delay, by cause (`history.misses`)."""

from __future__ import annotations

from collections.abc import Mapping

from ..history.misses import CAUSES, miss_causes
from ..history.slo import slo_figures
from ..palette import MISS_COLORS
from .common import (
    MAX_LINES,
    NO_STEPS,
    WIDTH,
    altair,
    chart_function,
    color_scale,
    empty_chart,
    highlight,
    rows_height,
)


def has_slo(history) -> bool:
    """Whether the history's meta carries an SLO ("slo"): the views then show `slo_misses`."""
    return bool(getattr(history, "meta", {}).get("slo"))


@chart_function
def slo_misses(history, slo: Mapping[str, float] | None = None, highlight_uid: int | None = None):
    """Each request that missed `slo` (default: the meta's), its delay split by cause, the
    `MAX_LINES` most delayed first; the title gives goodput and attainment."""
    alt = altair()
    slo = slo if slo is not None else getattr(history, "meta", {}).get("slo")
    if not slo:
        return empty_chart(alt, "no SLO: slo_misses(history, slo={'ttft_ms': 500, ...})")
    if history.steps.empty:
        return empty_chart(alt, NO_STEPS)
    causes = miss_causes(history, slo)
    figures = slo_figures(history, slo)
    title = (
        f"Why requests missed the SLO ({', '.join(f'{k} {v:g}' for k, v in slo.items())}): "
        f"goodput {figures['goodput (req/s)']:.3g} req/s, {figures['SLO attainment (%)']:.0f}% "
        "met it"
    )
    if causes.empty:
        return empty_chart(alt, f"{title}: none missed")
    shown = causes.nlargest(MAX_LINES, "delay_ms")
    if len(shown) < len(causes):
        title += f" ({len(shown)} most delayed of {len(causes)} missed)"
    long = shown.melt(["uid", "missed", "delay_ms"], list(CAUSES), "cause", "ms")
    long = long[long.ms > 0]
    order = [str(u) for u in shown.uid]
    colors = {c: MISS_COLORS[c] for c in CAUSES if c in set(long.cause)}
    return (
        alt.Chart(long.assign(request=long.uid.astype(str)))
        .mark_bar()
        .encode(
            x=alt.X("sum(ms):Q", title="delay (ms), by cause"),
            y=alt.Y("request:N", sort=order, title="request"),
            color=color_scale(alt, "cause", colors),
            opacity=highlight(alt, highlight_uid),
            tooltip=[
                "uid:O",
                "missed:N",
                "cause:N",
                alt.Tooltip("ms:Q", format=".1f"),
                alt.Tooltip("delay_ms:Q", format=".1f"),
            ],
        )
        .properties(width=WIDTH, height=rows_height(len(shown)), title=title)
    )

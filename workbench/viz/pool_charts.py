"""A prefix cache's hit rate against the KV pool's size (`hit_rate_chart`), from the table of
`traces.pool_reuse`: a panel for tokens and one for blocks, each with the trace's ideal (an
unbounded cache) as a dashed rule."""

from __future__ import annotations

import pandas as pd

from .common import WIDTH, altair

MEASURES = {"tokens": "prompt tokens", "blocks": "prompt blocks"}
COLOR = "#2a9d8f"
IDEAL_COLOR = "#555555"


def hit_rate_chart(table: pd.DataFrame):
    """Hit rate (a share of prompt tokens, and of blocks) against the pool's size in pages (a
    log2 axis, each size swept labelled), one point per run, and the ideal's rule above them."""
    alt = altair()
    missing = {"pool_tokens", "token_hit_rate", "ideal_block_hit_rate"} - set(table.columns)
    if missing or table.index.name != "num_pages" or table.empty:
        raise ValueError(
            "hit_rate_chart draws traces.pool_reuse's table (indexed by num_pages, with "
            f"pool_tokens and the hit rates); this one lacks {sorted(missing) or 'rows'}"
        )
    pages = [int(n) for n in table.index]
    page_size = int(table.pool_tokens.iloc[0] // pages[0])
    low, high = (pages[0], pages[-1]) if len(pages) > 1 else (pages[0] / 2, pages[0] * 2)
    x = alt.X(
        "num_pages:Q",
        title=f"KV pool (pages of {page_size} tokens)",
        scale=alt.Scale(type="log", base=2, domain=[low, high], nice=False, padding=8),
        axis=alt.Axis(values=pages, labelOverlap=False, format="d", labelFlush=False),
    )
    panels = []
    for measure, what in MEASURES.items():
        singular = measure[:-1]
        rows = pd.DataFrame(
            {
                "num_pages": pages,
                "pool_tokens": table.pool_tokens.to_numpy(),
                "hit_rate": table[f"{singular}_hit_rate"].to_numpy(),
                "hits": table[f"hit_{measure}"].to_numpy(),
                "of": table[f"prompt_{measure}"].to_numpy(),
            }
        )
        ideals = pd.DataFrame({"ideal": sorted(set(table[f"ideal_{singular}_hit_rate"]))})
        top = max(float(ideals.ideal.max()), float(rows.hit_rate.max())) * 1.15 or 1.0
        y = alt.Y(
            "hit_rate:Q",
            title=f"share of {what} cached",
            scale=alt.Scale(domain=[0, top], nice=False),
            axis=alt.Axis(format="%"),
        )
        run = (
            alt.Chart(rows)
            .mark_line(point=alt.OverlayMarkDef(color=COLOR, size=40), color=COLOR)
            .encode(
                x=x,
                y=y,
                tooltip=[
                    alt.Tooltip("num_pages:Q", title="pages"),
                    alt.Tooltip("pool_tokens:Q", title="pool tokens", format=","),
                    alt.Tooltip("hit_rate:Q", title="hit rate", format=".2%"),
                    alt.Tooltip("hits:Q", title=f"{measure} cached", format=","),
                    alt.Tooltip("of:Q", title=f"of {measure}", format=","),
                ],
            )
        )
        rule = (
            alt.Chart(ideals)
            .mark_rule(color=IDEAL_COLOR, strokeDash=[5, 4])
            .encode(
                y=alt.Y("ideal:Q", scale=alt.Scale(domain=[0, top], nice=False)),
                tooltip=[alt.Tooltip("ideal:Q", title="ideal (unbounded cache)", format=".2%")],
            )
        )
        size = dict(width=WIDTH // 2 - 20, height=200, title=f"in {measure}")
        panels.append(alt.layer(rule, run).properties(**size))
    return alt.hconcat(*panels).properties(
        title="Prefix-cache hit rate against the KV pool's size · dashed: the trace's ideal "
        "(an unbounded cache)"
    )

"""A step's page-table rows put back together from what each row gained per step (record="full")."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def pages_at(pages: pd.DataFrame, step: int) -> pd.DataFrame:
    """The rows of `step`, joined into maximal runs: a run gained at step s belongs to every later
    step of its row with the same `since`."""
    columns = ["step", "uid", "table_idx", "pos_start", "pos_end", "slot_start"]
    if "since" not in pages.columns:
        return pages.loc[pages.step == step, columns].reset_index(drop=True)
    keys = pages.loc[pages.step == step, ["uid", "table_idx", "since"]].drop_duplicates()
    runs = pages[pages.step <= step].merge(keys, on=["uid", "table_idx", "since"])
    runs = runs.sort_values(["table_idx", "pos_start"], ignore_index=True)
    same_row = runs.table_idx.eq(runs.table_idx.shift())
    goes_on = same_row & runs.pos_start.eq(runs.pos_end.shift())
    goes_on &= runs.slot_start.eq((runs.slot_start + runs.pos_end - runs.pos_start).shift())
    group = (~goes_on).cumsum()
    joined = runs.groupby(group, sort=False).agg(
        uid=("uid", "first"),
        table_idx=("table_idx", "first"),
        pos_start=("pos_start", "first"),
        pos_end=("pos_end", "last"),
        slot_start=("slot_start", "first"),
    )
    return joined.assign(step=step)[columns].reset_index(drop=True)

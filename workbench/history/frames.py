"""The finishing touches of a history's tables: rank columns, rounding, text as string dtype."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def add_rank_columns(
    steps: pd.DataFrame, rank_ms: dict[int, list[float]], prefix: str = "device_ms_rank"
) -> None:
    """Tensor parallelism: a column per rank 1.. (`<prefix>1`.., NaN until read)."""
    if not rank_ms:
        return
    for r in range(int(steps.tp_size.max()) - 1):
        steps[f"{prefix}{r + 1}"] = [
            v[r] if len(v := rank_ms.get(s, ())) > r else math.nan for s in steps.step
        ]


def rounded(frame: pd.DataFrame) -> pd.DataFrame:
    """Times to the nanosecond: further digits are noise, and would not survive a save (JSON)."""
    decimals = {c: 9 if c.endswith("_s") or c.endswith("_at") else 6 for c in frame.columns}
    floats = [c for c in frame.columns if frame[c].dtype.kind == "f"]
    return frame.round({c: (3 if c.endswith("_us") else decimals[c]) for c in floats})


def text_as_string(frame: pd.DataFrame) -> pd.DataFrame:
    """Text columns as pandas' "string" dtype (missing = <NA>), which survives save and load."""
    text = [c for c in frame.columns if frame[c].dtype == object or str(frame[c].dtype) == "str"]
    return frame.astype({c: "string" for c in text}) if text else frame

"""The history's requests table: one row per request, its lengths and latencies."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .latency import tpot

if TYPE_CHECKING:
    import pandas as pd


class RequestRow(NamedTuple):
    uid: int
    source: str  # how it came: "python" (a call) or "http" (the server)
    prompt_tokens: int
    max_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None
    arrival_step: int
    first_scheduled_step: int | None
    first_token_step: int | None
    finish_step: int | None
    arrival_s: float
    first_scheduled_s: float | None
    first_token_s: float | None
    finish_s: float | None
    ttft_s: float | None
    tpot_s: float | None


def requests_table(
    steps: pd.DataFrame, ledger: pd.DataFrame, arrivals: dict, aborts: dict
) -> pd.DataFrame:
    """One row per request in `arrivals` (`History.arrivals`), with `aborts` for those that ended
    between steps."""
    import pandas as pd

    end_s = dict(zip(steps["step"], steps["completed_at"]))
    start_s = dict(zip(steps["step"], steps["launched_at"]))
    # NOTE: whole-table aggregations, not a filter per request: a live view rebuilds every step
    by_uid = ledger.groupby("uid", sort=False)
    first_step = by_uid["step"].min().to_dict()
    cached_of = by_uid["cached_tokens"].first().to_dict()
    sampled = ledger[ledger["token"].notna()].groupby("uid", sort=False)["step"]
    first_token, counts = sampled.min().to_dict(), sampled.size().to_dict()
    done = ledger[ledger["finish"].notna()].drop_duplicates("uid")
    finish_of = dict(zip(done["uid"], zip(done["finish"], done["step"])))
    rows = []
    for uid, (step, seconds, prompt, max_tokens, *source) in sorted(arrivals.items()):
        first, first_tok = first_step.get(uid), first_token.get(uid)
        count = counts.get(uid, 0)
        fin = finish_of.get(uid)
        t_first = end_s.get(first_tok) if first_tok is not None else None
        t_fin = end_s.get(fin[1]) if fin is not None else None
        if fin is None and uid in aborts:
            step_ended, t_fin, reason = aborts[uid]
            fin = (reason, step_ended)
        row = RequestRow(
            uid=uid,
            source=source[0] if source else "python",
            prompt_tokens=prompt,
            max_tokens=max_tokens,
            cached_tokens=int(cached_of.get(uid, 0)),
            completion_tokens=count,
            finish_reason=None if fin is None else fin[0],
            arrival_step=step,
            first_scheduled_step=first,
            first_token_step=first_tok,
            finish_step=None if fin is None else fin[1],
            arrival_s=seconds,
            first_scheduled_s=start_s.get(first) if first is not None else None,
            first_token_s=t_first,
            finish_s=t_fin,
            ttft_s=None if t_first is None else t_first - seconds,
            tpot_s=tpot(t_first, t_fin, count),
        )
        rows.append(row)
    frame = pd.DataFrame(rows, columns=RequestRow._fields)
    ints = ["first_scheduled_step", "first_token_step", "finish_step"]
    times = [c for c in RequestRow._fields if c.endswith("_s")]
    return frame.astype({c: "Int64" for c in ints} | {c: "float64" for c in times})

"""The static report: one self-contained HTML file with the run's summary, every chart and the
request table. The Vega bundle is inlined once (from vl-convert), so it opens offline; without
vl-convert-python the page loads Vega from a CDN instead, and says so."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from ..history.latency import inter_token_latencies, output_throughput, run_seconds
from . import charts
from .causes import describe, run_causes
from .common import check_recorded, vega_offline


def summary(history) -> dict:
    """Headline figures of a run, from its tables. The median ITL is over the gaps between
    consecutive tokens of all requests; the median TPOT over the requests' own means."""
    steps, requests = history.steps, history.requests
    itl = inter_token_latencies(steps, history.ledger)
    seconds = run_seconds(requests)  # the first arrival to the last finish
    tokens = int(requests.completion_tokens.sum())
    facts = {
        "steps": len(steps),
        "prefill steps": int((steps.phase == "prefill").sum()),
        "decode steps": int((steps.phase == "decode").sum()),
        "mixed steps": int((steps.phase == "mixed").sum()),
        "requests": len(requests),
        "prompt tokens": int(requests.prompt_tokens.sum()),
        "cached prompt tokens": int(requests.cached_tokens.sum()),
        "output tokens": tokens,
        "seconds": round(seconds, 3),
        "output tokens/s": round(output_throughput(requests), 1) if seconds else None,
        "median TTFT (ms)": _ms(requests.ttft_s.median()),
        "median TPOT (ms)": _ms(requests.tpot_s.median()),
        "median ITL (ms)": _ms(itl.median()),
        "largest batch": int(steps.batch_size.max()) if len(steps) else 0,
        "peak KV in use (tokens)": int(steps.kv_in_use.max()) if len(steps) else 0,
    }
    if "experts_touched" in steps and steps.experts_touched.notna().any():  # an MoE model
        decode = steps[steps.phase == "decode"]
        facts["experts touched per MoE layer (mean of decode steps)"] = (
            round(float(decode.experts_touched.mean()), 2) if len(decode) else None
        )
    return facts


def focus_step(history) -> int:
    """The step shown in the per-step charts: the first with the largest batch."""
    steps = history.steps
    return int(steps.step[steps.batch_size.idxmax()]) if len(steps) else 0


def write_report(
    history, path: str | Path, title: str | None = None, meta: dict | None = None
) -> Path:
    """Write `history` as one HTML file that opens offline (where vl-convert-python is
    installed), `meta` added to its settings."""
    check_recorded(history, "the run")
    step = focus_step(history)  # the per-step charts' step; the others show the whole run
    figures = [
        (chart.title.format(step=step), chart.draw(history, step if chart.per_step else None))
        for chart in charts.CHARTS
        if chart.applies(history)
    ]
    meta = {**getattr(history, "meta", {}), **(meta or {})}
    texts = meta.pop("texts", None) or {}  # uid -> [prompt, answer], from Workbench.save
    if meta.get("simulated"):
        title = title or f"workbench twin (simulated): {meta.get('model', '')} on " + str(
            meta.get("device_name", "")
        )
        costs = meta.pop("step_costs", None) or {}
        calibrated = costs.get("meta", {}).get("runs", [])
        meta["step costs fitted on"] = ", ".join(map(str, calibrated)) or "?"
    title = title or f"workbench run: {meta.get('model', '')}"
    figure_html, scripts = [], []
    for i, (name, chart) in enumerate(figures):
        figure_html.append(f'<h3>{html.escape(name)}</h3><div id="fig{i}"></div>')
        spec = json.dumps(chart.to_dict())
        scripts.append(f"vegaEmbed('#fig{i}', {spec}, {{actions: false}}).catch(console.error);")
    vega, offline = vega_scripts()
    facts = {**summary(history), **{f"config: {k}": v for k, v in meta.items()}}
    doc = _PAGE.format(
        title=html.escape(title),
        vega=vega,
        online="" if offline else f"<p>{_ONLINE}</p>",
        summary=_table(pd.DataFrame({"": list(facts), "value": [str(v) for v in facts.values()]})),
        said=html.escape(describe("This run", run_causes(history))),
        figures="\n".join(figure_html),
        requests=_table(history.requests.round(4)),
        texts=_texts_table(texts),
        scripts="\n".join(scripts),
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc, encoding="utf-8")
    return path


_ONLINE = (
    "The charts load Vega from cdn.jsdelivr.net: vl-convert-python was not installed when this "
    "page was written, so they stay blank without a network."
)


def vega_scripts() -> tuple[str, bool]:
    """The page's Vega, Vega-Lite and vega-embed: one inline bundle from vl-convert, or where it
    is not installed the CDN's; and whether the page opens offline."""
    import altair as alt

    vl = alt.VEGALITE_VERSION
    if vega_offline():
        import vl_convert as vlc

        bundle = vlc.javascript_bundle(vl_version=vl.rsplit(".", 1)[0])
        return f'<script type="text/javascript">\n{bundle}\n</script>', True
    cdn = "https://cdn.jsdelivr.net/npm"
    return "\n".join(
        f'<script src="{cdn}/{name}"></script>'
        for name in (
            f"vega@{alt.VEGA_VERSION}",
            f"vega-lite@{vl}",
            f"vega-embed@{alt.VEGAEMBED_VERSION}",
        )
    ), False


def save_png(chart, path: str | Path, scale: float = 2.0) -> Path:
    """A chart as PNG, rendered offline by vl-convert."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    chart.save(str(path), scale_factor=scale)
    return path


def _ms(seconds) -> float | None:
    return None if pd.isna(seconds) else round(float(seconds) * 1e3, 2)


def _table(frame: pd.DataFrame) -> str:
    return (
        f'<div class="wide">{frame.to_html(index=False, border=0, classes="tbl", na_rep="")}</div>'
    )


def _texts_table(texts: dict) -> str:
    """Each request's prompt and answer (long prompts shortened in the middle)."""
    if not texts:
        return "<p><i>no texts: reports written by a Workbench carry them</i></p>"
    rows = []
    for uid, (prompt, answer) in texts.items():
        if len(prompt) > 600:
            prompt = prompt[:300] + " … " + prompt[-250:]
        rows.append(
            f"<tr><td>#{html.escape(str(uid))}</td><td>{html.escape(prompt)}</td>"
            f"<td>{html.escape(answer)}</td></tr>"
        )
    head = "<tr><th>request</th><th>prompt</th><th>answer</th></tr>"
    return f'<table class="texts">{head}{"".join(rows)}</table>'


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }}
.wide {{ max-width: 100%; overflow-x: auto; }}
.tbl {{ border-collapse: collapse; font-size: 11px; font-family: monospace; }}
.tbl td, .tbl th {{ padding: 2px 6px; border-bottom: 1px solid #ddd; text-align: right; }}
.tbl th {{ white-space: normal; word-break: break-word; vertical-align: bottom; }}
.texts {{ border-collapse: collapse; width: 100%; table-layout: fixed; font-size: 13px; }}
.texts td, .texts th {{ padding: 4px 8px; border-bottom: 1px solid #ddd; text-align: left;
  vertical-align: top; white-space: pre-wrap; overflow-wrap: anywhere; }}
.texts th:first-child {{ width: 5em; }}
.vega-embed {{ max-width: 100%; overflow-x: auto; }}
h3 {{ margin-bottom: 4px; }}
</style>
{vega}</head>
<body>
<h1>{title}</h1>
{online}<h2>Summary</h2>
<p>{said}</p>
{summary}
<h2>Charts</h2>
{figures}
<h2>Prompts and answers</h2>
{texts}
<h2>Requests</h2>
{requests}
<script type="text/javascript">
{scripts}
</script>
</body></html>
"""

"""`trace report`: a self-contained HTML page (PNG figures embedded as data URIs, data as JSON) about a store.

The page needs no network and no server: open it in any browser, attach it to a ticket, or archive it next to
the store. Figures: Δ/coverage per capability with the selection thresholds, calibration attempts against
their band, GRPO reward curves, pass@1/pass^k per task family for every model on every environment, MoE
routing accuracy per expert, and the sample-efficiency plot when its JSON is given.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from trace_cli.report import collect as _collect

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
color:#222;padding:0 1em}h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
img{max-width:100%;border:1px solid #eee}table{border-collapse:collapse;font-size:.9em}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}.muted{color:#777}
"""


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def render(data: dict[str, Any]) -> tuple[str, int]:
    """The page and the number of figures in it."""
    from trace_cli.report import plots

    parts: list[str] = []
    figures = 0

    def fig(png: bytes, alt: str) -> None:
        nonlocal figures
        figures += 1
        parts.append(
            f"<figure>{_img(png, alt)}<figcaption class=muted>{html.escape(alt)}</figcaption></figure>"
        )

    if data["diagnoses"]:
        parts.append("<h2>Diagnosis: gap and coverage per capability</h2>")
        for d in data["diagnoses"]:
            sel = ", ".join(c["name"] for c in d["capabilities"] if c["selected"]) or "none"
            parts.append(
                f"<p>{html.escape(d['name'])} of {html.escape(str(d['rollouts']))}: selected {sel}</p>"
            )
            fig(plots.diagnosis(d), f"diagnosis {d['name']}: Δ and coverage (dashed: thresholds)")
    if data["calibrations"]:
        parts.append("<h2>Calibration</h2>")
        fig(plots.calibration(data["calibrations"]), "calibration attempts per environment against the band")
    if data["reward_curves"]:
        parts.append("<h2>GRPO training</h2>")
        fig(plots.rewards(data["reward_curves"]), "GRPO reward and success per optimizer step")
    if data["evals"]:
        parts.append("<h2>Evaluation: pass@1 per task family</h2>")
        for e in data["evals"]:
            fig(plots.families(e), f"{e['env']}: pass@1 per task family")
            rows = "".join(
                f"<tr><td>{html.escape(r['name'])}</td><td>{html.escape(r['model'])}</td><td>{r['seeds']}</td>"
                f"<td>{(r['pass@1'] or 0):.3f}</td><td>{html.escape(json.dumps(r['pass^k']))}</td></tr>"
                for r in e["runs"]
            )
            parts.append(
                "<table><tr><th>eval</th><th>model</th><th>seeds</th><th>pass@1</th><th>pass^k</th></tr>"
                f"{rows}</table>"
            )
    if data["routing"]:
        parts.append("<h2>Composition routing</h2>")
        fig(plots.routing(data["routing"]), "routing accuracy per expert on held-out turns")
    if data.get("sample_efficiency"):
        parts.append("<h2>Sample efficiency</h2>")
        fig(plots.sample_efficiency(data["sample_efficiency"]), "held-out pass@1 against rollouts")
    if not figures:
        parts.append("<p>The store holds no diagnosis, environment, adapter, eval or composition yet.</p>")
    title = f"trace report — {data['store']}"
    payload = json.dumps(data, default=str).replace("</", "<\\/")
    page = (
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        + (f"<p class=muted>recipe: {html.escape(data['recipe'])}</p>" if data.get("recipe") else "")
        + "".join(parts)
        + f'<script type="application/json" id="trace-report-data">{payload}</script></body></html>'
    )
    return page, figures


def write_report(store, out: Path, recipe: Path | None = None, sample_efficiency: Path | None = None) -> dict:
    """Collect, render and write atomically (a reader never sees half a page); returns what was written."""
    from trace_cli.formats import write_atomic

    data = _collect.collect(store, recipe, sample_efficiency)
    page, figures = render(data)
    write_atomic(Path(out), lambda f: f.write(page))
    return {
        "out": str(out),
        "figures": figures,
        "bytes": len(page.encode()),
        "sections": {k: len(v) for k, v in data.items() if isinstance(v, list)},
    }

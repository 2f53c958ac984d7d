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
.first{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,1.2fr);gap:1.2em;align-items:start}
.first h3,.first-wide h3{font-size:1em;margin:.9em 0 .3em}.first table{width:100%}.verdict{border:1px solid #ccc;padding:.2em .9em;
background:#fafafa;overflow-wrap:anywhere}.up{color:#17803d}.down{color:#b42318}
"""


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _num(x: Any, fmt: str = "{:.3f}") -> str:
    return "" if x is None else fmt.format(x)


def _provenance(se: dict[str, Any]) -> str:
    state = {True: "dirty", False: "clean", None: "state not recorded"}.get(se.get("dirty"), "")
    commits = ", ".join(c[:10] for c in se.get("commits") or [se.get("commit") or "?"])
    return (
        f"{se['file']}: commit(s) {commits} ({state}); test seeds {se.get('held_out')}, "
        f"training seeds {se.get('train_seeds')}; TRACE = the MoE"
    )


def _verdict(v: dict[str, Any]) -> str:
    """A pre-registered run's decision, as the benchmark applied it (`verdict`)."""
    state = "holds" if v.get("holds") else ("does not hold" if v.get("complete") else "incomplete")
    return (
        f"Pre-registered decision ({v.get('rule')}): {state}: gain ratio {_num(v.get('gain_ratio'), '{:.2f}×') or 'n/a'}, "
        f"90 % lower bound {_num(v.get('difference_lower_90'), '{:+.3f}') or 'n/a'}"
    )


def _se_table(panel: dict[str, Any]) -> str:
    """Mean pass@1 per method and budget, the gain ratio, and the paired bootstrap where the file has it."""
    methods = list(panel["methods"])
    head = "".join(f"<th>{html.escape(m)}</th>" for m in ["rollouts", *methods, "gain ratio"])
    body = ""
    for i, x in enumerate(panel["rollouts"]):
        cells = [_num(panel["methods"][m]["mean"][i]) for m in methods]
        cells.append(_num(panel["gain_ratio"][i], "{:.2f}×"))
        body += f"<tr><td>{x}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
    boot = ""
    for budget, b in panel["bootstrap"].items():
        d, r = b["difference"], b["ratio"]
        ci = r.get("interval_95")
        boot += (
            f"<li>{budget} rollouts ({len(b['seeds'])} seeds × {b['tasks']} tasks, paired bootstrap): TRACE gain − "
            f"GRPO gain {d['mean']:+.3f}, 90 % lower bound {d['lower_90']:+.3f}; gain ratio "
            f"{_num(r.get('mean'), '{:.2f}×')}, 95 % interval "
            f"{'–' if ci is None else f'[{ci[0]:.2f}, {ci[1]:.2f}]'}</li>"
        )
    return f"<table><tr>{head}</tr>{body}</table>" + (f"<ul>{boot}</ul>" if boot else "")


def _gain(base: Any, this: Any) -> str:
    """`base → this`, coloured by the sign of the change."""
    if this is None:
        return ""
    if base is None:
        return f"{this:.3f}"
    cls = "up" if this > base else ("down" if this < base else "muted")
    return f"{base:.3f} → <span class={cls}>{this:.3f}</span>"


def _table(head: list[str], rows: list[list[str]], empty: str) -> str:
    if not rows:
        return f"<p class=muted>{html.escape(empty)}</p>"
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def first_screen(data: dict[str, Any]) -> str:
    """What the loop found and fixed, with the benchmark's verdict beside it (the page's first screen)."""
    f = data.get("findings") or {}
    e = html.escape
    caps = _table(
        ["capability", "gap Δ", "coverage", "runs", "diagnosis"],
        [
            [
                e(c["name"]),
                f"{c['delta']:+.2f}",
                f"{c['coverage']:.2f}",
                f"{c.get('runs_passed')}/{c.get('runs_total')}",
                e(c["diagnosis"]),
            ]
            for c in f.get("capabilities") or []
        ],
        "no diagnosis in this store",
    )
    envs = _table(
        ["environment", "capability", "calibrated", "success (band)"],
        [
            [
                e(x["name"]),
                e(str(x["capability"])),
                (
                    f"level {x['level']}"
                    if x["admitted"]
                    else f"<span class=down>not in band</span> ({x['attempts']} attempts)"
                ),
                f"{_num(x['success'])} ({x['band'][0]}–{x['band'][1]})",
            ]
            for x in f.get("environments") or []
        ],
        "no environment in this store",
    )
    adapters = _table(
        ["adapter", "capability", "evaluated on", "base → adapter"],
        [
            [
                e(a["name"]),
                e(str(a["capability"])),
                f"{e(a['env'])} {e(a['seeds'])}",
                _gain(a["base_pass@1"], a["pass@1"]),
            ]
            for a in f.get("adapters") or []
        ],
        "no evaluated adapter in this store",
    )
    comps = f.get("compositions") or []
    fams = sorted({k for c in comps for k in c["families"]})
    compositions = _table(
        ["composition", "evaluated on", "pass@1", *fams],
        [
            [
                f"{e(c['name'])} <span class=muted>({e(str(c['method']))})</span>",
                f"{e(c['env'])} {e(c['seeds'])}",
                _gain(c["base_pass@1"], c["pass@1"]),
                *[
                    _gain(c["families"].get(k, {}).get("base"), c["families"].get(k, {}).get("this"))
                    for k in fams
                ],
            ]
            for c in comps
        ],
        "no evaluated composition in this store",
    )
    se = data.get("sample_efficiency")
    if se and isinstance(se.get("verdict"), dict):
        v = se["verdict"]
        state = "holds" if v.get("holds") else ("does not hold" if v.get("complete") else "incomplete")
        cls = "up" if v.get("holds") else "down"
        aside = (
            f"<p>TRACE against GRPO on the target, pre-registered: <b class={cls}>{state}</b></p>"
            f"<p>gain ratio <b>{_num(v.get('gain_ratio'), '{:.2f}×') or 'n/a'}</b>; 90 % lower bound of "
            f"TRACE gain − GRPO gain <b>{_num(v.get('difference_lower_90'), '{:+.3f}') or 'n/a'}</b></p>"
            f"<p class=muted>rule: {e(str(v.get('rule')))}<br>{e(se['file'])}</p>"
        )
    elif se:
        aside = f"<p>{e(se['file'])}: no pre-registered verdict</p>"
    else:
        aside = (
            "<p class=muted>No benchmark given: add <code>--sample-efficiency FILE</code> (e.g. "
            "benchmarks/results/sample_efficiency_mixed.json) to show its verdict here.</p>"
        )
    return (
        "<h2>What the loop found and fixed</h2><div class=first><div>"
        f"<h3>Found: the capabilities the diagnosis selected</h3>{caps}"
        f"<h3>Environments, calibrated on the policy</h3>{envs}"
        f"<h3>Fixed: each adapter against its base (same environment and seeds)</h3>{adapters}"
        f"</div><aside class=verdict><h3>Benchmark verdict</h3>{aside}</aside></div>"
        f"<div class=first-wide><h3>Compositions against the base, per task family</h3>{compositions}</div>"
    )


def render(data: dict[str, Any]) -> tuple[str, int]:
    """The page and the number of figures in it."""
    from trace_cli.report import plots

    parts: list[str] = [first_screen(data)]
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
        se = data["sample_efficiency"]
        parts.append("<h2>Sample efficiency</h2>")
        parts.append(f"<p class=muted>{html.escape(_provenance(se))}</p>")
        if isinstance(se.get("verdict"), dict):
            parts.append(f"<p><b>{html.escape(_verdict(se['verdict']))}</b></p>")
        for panel in se["targets"]:
            fig(plots.sample_efficiency(panel), f"{panel['target']}: held-out pass@1 against rollouts")
            parts.append(_se_table(panel))
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
        "findings": data["findings"],
    }

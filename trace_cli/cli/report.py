"""`trace report --store DIR [--recipe FILE] [--sample-efficiency JSON] --out report.html`.

Not a stage: the page is a file for people, not an artifact (nothing to id, cache or chain); it reads the
store's artifacts and writes one self-contained HTML file atomically.
"""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option


@click.command(
    epilog=(
        "Examples:\n\n  trace report --store store --out report.html\n\n"
        "  trace report --recipe recipes/demo.yaml --out demo.html   (only the recipe's artifacts)\n\n"
        "  trace report --sample-efficiency benchmarks/results/sample_efficiency_mixed.json --out se.html\n\n"
        "The page embeds its PNG figures and the data behind them (a JSON script block), so it can be "
        "opened offline or attached anywhere."
    )
)
@click.option("--out", required=True, type=click.Path(), help="HTML file to write.")
@click.option(
    "--recipe",
    type=click.Path(exists=True, dir_okay=False),
    help="Show only the artifacts this recipe's steps name.",
)
@click.option(
    "--sample-efficiency",
    "sample_efficiency",
    type=click.Path(exists=True, dir_okay=False),
    help="JSON written by benchmarks/sample_efficiency.py: adds its pass@1-vs-rollouts plot and table per "
    "target (exit 2 for a file that is not one).",
)
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@json_option
@store_option
def report(out, recipe, sample_efficiency, force, as_json, store_dir):
    """Write an HTML report with plots: diagnosis gaps, calibration, GRPO curves, pass@1 per family."""
    from pathlib import Path

    from trace_cli.formats import check_out
    from trace_cli.report import write_report

    path = check_out(out, force=force)
    res = write_report(
        open_store(store_dir),
        path,
        Path(recipe) if recipe else None,
        Path(sample_efficiency) if sample_efficiency else None,
    )
    if as_json:
        echo_json(res)
    else:
        rows = findings_rows(res["findings"])
        if rows:
            print_table(["", "name", "on", "result"], rows, title="What the loop found and fixed")
        info(f"wrote {res['out']}: {res['figures']} figure(s), {res['bytes'] / 1024:.0f} KiB")


def findings_rows(f: dict) -> list[list[str]]:
    """The report's first screen as table rows (what `make demo` prints at its end)."""

    def n(x) -> str:
        return "?" if x is None else f"{x:.3f}"

    rows = [
        ["selected", c["name"], c["diagnosis"], f"gap {c['delta']:+.2f}, coverage {c['coverage']:.2f}"]
        for c in f.get("capabilities") or []
    ]
    rows += [
        [
            "environment",
            e["name"],
            str(e["capability"]),
            f"level {e['level']}, success {n(e['success'])}"
            if e["admitted"]
            else "not calibrated (out of band)",
        ]
        for e in f.get("environments") or []
    ]
    for kind in ("adapters", "compositions"):
        for a in f.get(kind) or []:
            label = a["name"] if kind == "adapters" else f"{a['name']} ({a['method']})"
            rows.append(
                [
                    kind[:-1],
                    label,
                    f"{a['env']} {a['seeds']}",
                    f"base {n(a['base_pass@1'])} -> {n(a['pass@1'])}",
                ]
            )
    return rows

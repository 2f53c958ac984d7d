"""`trace report --store DIR [--recipe FILE] [--sample-efficiency JSON] --out report.html`.

Not a stage: the page is a file for people, not an artifact (nothing to id, cache or chain); it reads the
store's artifacts and writes one self-contained HTML file atomically.
"""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, store_option


@click.command(
    epilog=(
        "Examples:\n\n  trace report --store store --out report.html\n\n"
        "  trace report --recipe recipes/demo.yaml --out demo.html   (only the recipe's artifacts)\n\n"
        "  trace report --sample-efficiency benchmarks/results/sample_efficiency.json --out se.html\n\n"
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
    help="JSON written by benchmarks/sample_efficiency.py: adds the pass@1-vs-rollouts plot.",
)
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@json_option
@store_option
def report(out, recipe, sample_efficiency, force, as_json, store_dir):
    """Write an HTML report with plots: diagnosis gaps, calibration, GRPO curves, pass@1 per family."""
    import json
    from pathlib import Path

    from trace_cli.errors import UsageError
    from trace_cli.formats import check_out
    from trace_cli.report import write_report

    path = check_out(out, force=force)
    if sample_efficiency:
        try:
            doc = json.loads(Path(sample_efficiency).read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise UsageError(f"{sample_efficiency}: not JSON ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("budgets"), list):
            raise UsageError(
                f"{sample_efficiency}: expected benchmarks/sample_efficiency.py's JSON (an object with 'budgets')"
            )
    res = write_report(
        open_store(store_dir),
        path,
        Path(recipe) if recipe else None,
        Path(sample_efficiency) if sample_efficiency else None,
    )
    if as_json:
        echo_json(res)
    else:
        info(f"wrote {res['out']}: {res['figures']} figure(s), {res['bytes'] / 1024:.0f} KiB")

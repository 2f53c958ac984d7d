"""Options and output helpers shared by every command (no heavy imports here)."""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Any

import click

from trace_cli.store.layout import default_store_root


def _set_verbose(ctx, param, value):
    from trace_cli.cli import set_verbose

    set_verbose(value)


verbose_option = click.option(
    "-v",
    "--verbose",
    is_flag=True,
    expose_value=False,
    callback=_set_verbose,
    help="Show tracebacks on errors.",
)


def store_option(f):
    """`--store DIR` (default $TRACE_STORE, else ./store) plus -v."""
    f = click.option(
        "--store",
        "store_dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Store directory (default: $TRACE_STORE, else ./store).",
    )(f)
    return verbose_option(f)


def open_store(store_dir: str | None):
    from trace_cli.store import Store

    return Store(store_dir if store_dir else default_store_root())


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")(f)


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str, ensure_ascii=False))


def print_table(columns: list[str], rows: list[Any], *, title: str | None = None) -> None:
    """A rich table on stdout (plain text when stdout is not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False, header_style="bold")
    for c in columns:
        table.add_column(str(c), overflow="fold")
    for r in rows:
        table.add_row(*["" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)) for v in r])
    Console(file=sys.stdout, width=200 if not sys.stdout.isatty() else None).print(table)


def to_csv(columns: list[str], rows: list[Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(columns)
    w.writerows(rows)
    return buf.getvalue()


def info(msg: str) -> None:
    """Progress/log lines go to stderr so stdout stays clean for results."""
    click.echo(msg, err=True)

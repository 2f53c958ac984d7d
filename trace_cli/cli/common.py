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


def open_store(store_dir: str | None, *, links: bool = True):
    """The store named by --store, else $TRACE_STORE, else ./store. A path that is not a directory is a usage
    error (exit 2). If a run was killed between committing an artifact and indexing it, the index is
    repaired here, so every command sees it (a warning, never a failure, if that is not possible now). A
    symbolic link where the store's own directory or file should be is refused (exit 2) unless `links` is
    False (`trace store verify`, which reports them)."""
    import os

    from trace_cli.errors import TraceError
    from trace_cli.models import device
    from trace_cli.store import Store

    device.check()  # $TRACE_DEVICE asks for a GPU that is not here: exit 2 before the store is touched
    if store_dir:
        st = Store(store_dir, origin=f"--store {store_dir}")
    elif os.environ.get("TRACE_STORE"):
        st = Store(default_store_root(), origin=f"$TRACE_STORE={os.environ['TRACE_STORE']}")
    else:
        st = Store(default_store_root())
    st.check_root(links=links)
    try:
        fixed = st.repair_index()
    except (TraceError, OSError) as e:
        info(f"warning: could not repair the index ({e}); run `trace store reindex`")
    else:
        if fixed:
            info(f"repaired the index (a run was killed before indexing): {', '.join(fixed)}")
    return st


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")(f)


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str, ensure_ascii=False))


def echo_outcome(out, as_json: bool, hint: str = "", **extra: Any) -> bool:
    """How a stage command reports its main artifact. With --json: id, uri, kind, whether it was up to date,
    its summary (and `extra`) on stdout, and True (nothing more to print). Else False, after a note on stderr
    if the stage found the artifact up to date (`hint`: how to redo it)."""
    a = out.main
    if as_json:
        echo_json(
            {"id": a.id, "uri": a.uri, "kind": a.kind, "skipped": out.skipped, "summary": a.summary, **extra}
        )
        return True
    if out.skipped:
        info(f"up to date: {a.uri}" + (f" ({hint})" if hint else ""))
    return False


def print_table(columns: list[str], rows: list[Any], *, title: str | None = None) -> None:
    """A rich table on stdout (plain text when stdout is not a terminal)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from trace_cli.errors import shown

    # cells (ingested data, names) are untrusted: control characters escaped and plain text (no rich markup)
    table = Table(title=title, show_lines=False, header_style="bold")
    for c in columns:
        table.add_column(Text(shown(c)), overflow="fold")
    for r in rows:
        table.add_row(
            *[Text("" if v is None else (f"{v:.4g}" if isinstance(v, float) else shown(v))) for v in r]
        )
    Console(file=sys.stdout, width=200 if not sys.stdout.isatty() else None).print(table)


def to_csv(columns: list[str], rows: list[Any]) -> str:
    from trace_cli.errors import terminal_safe

    def cell(v: Any) -> Any:  # untrusted text: control characters escaped (newlines stay, CSV quotes them)
        return terminal_safe(v) if isinstance(v, str) else v

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([cell(c) for c in columns])
    w.writerows([cell(v) for v in r] for r in rows)
    return buf.getvalue()


def info(msg: str) -> None:
    """Progress/log lines go to stderr so stdout stays clean for results (control characters escaped: a
    line may quote untrusted text)."""
    from trace_cli.errors import terminal_safe

    click.echo(terminal_safe(msg), err=True)

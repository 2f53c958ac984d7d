"""`trace store ...`: list, show, query, verify, reindex and gc the artifact store."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option, to_csv
from trace_cli.store.layout import KINDS


@click.group(
    epilog='Example:\n\n  trace store ls --kind rollouts\n\n  trace store sql "SELECT tool_name, count(*) FROM tool_calls GROUP BY 1"'
)
def store():
    """Inspect and maintain the artifact store.

    Artifacts live in STORE/<kind>/<id>/ with a manifest.yaml; STORE/index.duckdb is a derived index
    (tables artifacts, lineage, names; views episodes, tool_calls, ...) that the plain `duckdb` CLI opens.
    """


def _summary_text(summary: dict) -> str:
    parts = []
    for k, v in list(summary.items())[:4]:
        if isinstance(v, float):
            v = f"{v:.3g}"
        elif isinstance(v, dict | list):
            continue
        parts.append(f"{k}={v}")
    return " ".join(parts)


@store.command("ls", epilog="Example:\n\n  trace store ls --kind rollouts --json")
@click.option("--kind", type=click.Choice(KINDS), help="Only artifacts of this kind.")
@json_option
@store_option
def ls(kind, as_json, store_dir):
    """List artifacts (oldest first)."""
    st = open_store(store_dir)
    arts = st.list(kind)
    names = st.names()
    rows = []
    for a in arts:
        al = [n for k, n, i in names if k == a.kind and i == a.id]
        rows.append(
            {
                "kind": a.kind,
                "id": a.id,
                "names": al,
                "stage": a.manifest.get("stage"),
                "created_at": a.manifest.get("created_at"),
                "summary": a.summary,
            }
        )
    if as_json:
        echo_json(rows)
        return
    if not rows:
        info(f"no artifacts in {st.root}")
        return
    print_table(
        ["kind", "id", "name", "stage", "created", "summary"],
        [
            [
                r["kind"],
                r["id"],
                ",".join(r["names"]),
                r["stage"],
                r["created_at"],
                _summary_text(r["summary"]),
            ]
            for r in rows
        ],
    )


@store.command("show", epilog="Example:\n\n  trace store show store://rollouts/gpt41-retail --json")
@click.argument("ref")
@json_option
@store_option
def show(ref, as_json, store_dir):
    """Show one artifact's manifest (REF: id, id prefix, name or store://KIND/NAME)."""
    st = open_store(store_dir)
    a = st.resolve(ref)
    doc = dict(a.manifest)
    doc["path"] = str(a.path)
    doc["names"] = st.names_of(a.kind, a.id)
    if as_json:
        echo_json(doc)
        return
    import yaml

    click.echo(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), nl=False)


@store.command(
    "sql",
    epilog='Example:\n\n  trace store sql "SELECT domain, avg(reward) FROM episodes GROUP BY ALL" --csv',
)
@click.argument("query")
@click.option("--json", "fmt", flag_value="json", help="Rows as a JSON list of objects.")
@click.option("--csv", "fmt", flag_value="csv", help="Rows as CSV with a header line.")
@store_option
def sql(query, fmt, store_dir):
    """Run a read-only SQL query against the index (views over every Parquet table)."""
    st = open_store(store_dir)
    cols, rows = st.query(query)
    if fmt == "json":
        echo_json([dict(zip(cols, r, strict=True)) for r in rows])
    elif fmt == "csv":
        click.echo(to_csv(cols, rows), nl=False)
    else:
        print_table(cols, rows)
        info(f"{len(rows)} row{'s' if len(rows) != 1 else ''}")


@store.command("reindex", epilog="Example:\n\n  rm store/index.duckdb && trace store reindex")
@store_option
def reindex(store_dir):
    """Rebuild index.duckdb from the manifests (the files are the truth)."""
    st = open_store(store_dir)
    counts = st.reindex()
    click.echo(f"reindexed {st.index_path}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))


@store.command("verify", epilog="Example:\n\n  trace store verify --json")
@json_option
@store_option
def verify(as_json, store_dir):
    """Re-hash every file and check the index against the manifests; report problems (exit 1 if any)."""
    from trace_cli.errors import CheckFailed, shown, terminal_safe
    from trace_cli.store import index

    st = open_store(store_dir, links=False)
    problems = st.verify()
    n = len(index.committed(st))
    if as_json:
        echo_json({"artifacts": n, "problems": problems})
    else:
        for p in problems:
            click.echo(terminal_safe(f"{p['kind']}/{shown(p['id'])}: " + "; ".join(p["problems"])))
        click.echo(f"verified {n} artifacts: {len(problems)} with problems")
    if problems:
        raise CheckFailed(f"{len(problems)} artifact(s) failed verification")


@store.command("gc", epilog="Example:\n\n  trace store gc --dry-run\n\n  trace store gc --include-resumable")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option(
    "--include-resumable",
    is_flag=True,
    help="Also remove checkpoints of interrupted training runs (otherwise kept for `trace train --resume`).",
)
@store_option
def gc(dry_run, include_resumable, store_dir):
    """Remove half-written temp directories left by killed runs, and the sandbox directories
    (TMP/trace-sandbox-*) of killed runs that evaluated untrusted environment modules."""
    from trace_cli.envs.sandbox import leftovers
    from trace_cli.errors import shown  # paths of leftovers: names anyone could give a file

    st = open_store(store_dir)
    if dry_run:
        for t in st.gc(dry_run=True, include_resumable=include_resumable):
            click.echo(f"would remove {shown(t)}")
        for t in leftovers.remove_stale(dry_run=True)[0]:
            click.echo(f"would remove {shown(t)}")
        return
    removed = st.gc(include_resumable=include_resumable)
    for r in removed:
        click.echo(f"removed {shown(r)}")
    click.echo(f"gc: removed {len(removed)} half-written director{'y' if len(removed) == 1 else 'ies'}")
    swept, failed = leftovers.remove_stale()
    for r in swept:
        click.echo(f"removed {shown(r)}")
    if swept:
        click.echo(
            f"gc: removed {len(swept)} sandbox director{'y' if len(swept) == 1 else 'ies'} of killed runs"
        )
    for f in failed:
        click.echo(f"warning: could not remove the sandbox directory {shown(f)}", err=True)

"""`trace validate FILE...`: check YAML/JSON files against their schema, reporting every error."""

from __future__ import annotations

import click

from trace_cli.cli.common import verbose_option


@click.command(
    epilog=(
        "Example:\n\n  trace validate recipes/demo.yaml configs/train.yaml episodes.jsonl\n\n"
        "The schema is chosen by the document's `kind` (recipe, a stage name such as ingest, manifest); "
        ".jsonl files are validated line by line as episode records."
    )
)
@click.argument("files", nargs=-1, required=True, type=click.Path())
@verbose_option
def validate(files):
    """Validate files by their `kind`; all errors are reported with file and YAML path (exit 2 if any)."""
    from trace_cli.config.schemas import validate_file
    from trace_cli.errors import TraceError, UsageError

    failed = 0
    for f in files:
        try:
            schema = "recipe.v1.json" if _check_recipe(f) else validate_file(f)
            click.echo(f"{f}: ok ({schema})")
        except TraceError as e:
            failed += 1
            click.echo(str(e) if str(e).startswith(str(f)) else f"{f}: {e}", err=True)
    if failed:
        raise UsageError(f"{failed} of {len(files)} file(s) invalid")


def _check_recipe(path: str) -> bool:
    """Recipes get the deeper checks too (each step's `with` against its stage, references, cycles), all
    reported together with the schema errors. Returns False when the file is not a recipe."""
    from pathlib import Path

    from trace_cli.config.loading import load_document

    if Path(path).suffix not in (".yaml", ".yml", ".json"):
        return False
    doc = load_document(path)
    if not (isinstance(doc, dict) and doc.get("kind") == "recipe"):
        return False
    from trace_cli.recipes import load_recipe

    load_recipe(path)
    return True

"""`trace run RECIPE` and `trace status RECIPE`: execute or inspect a recipe."""

from __future__ import annotations

import click

from trace_cli.cli.common import echo_json, info, json_option, open_store, print_table, store_option


@click.command(
    epilog=(
        "Examples:\n\n  trace run recipes/demo.yaml\n\n"
        "  trace run recipes/demo.yaml --set steps.train_precondition.with.max_steps=6 --from train_precondition\n\n"
        "  trace run recipes/demo.yaml --to ingest_retail --force\n\n"
        "A step whose config and input digests are unchanged is skipped. --from ID runs ID and the steps that "
        "depend on it; --to ID runs ID and the steps it depends on; other steps must be up to date."
    )
)
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Re-run the selected steps even if they are up to date.")
@click.option("--from", "from_", metavar="ID", help="Start at step ID (and what depends on it).")
@click.option("--to", metavar="ID", help="Stop at step ID (and what it depends on).")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="steps.ID.with.KEY=VALUE",
    help="Override a step's config (repeatable); printed and recorded in the manifest.",
)
@json_option
@store_option
def run(recipe, force, from_, to, overrides, as_json, store_dir):
    """Run a recipe: validate the whole DAG first, then execute steps in dependency order."""
    from trace_cli.recipes import load_recipe, run_recipe

    r = load_recipe(recipe, list(overrides))
    st = open_store(store_dir)
    reports = run_recipe(r, st, force=force, from_=from_, to=to, echo=info)
    rows = [
        {
            "step": x.id,
            "uses": x.uses,
            "status": x.status,
            "id": x.artifact_id,
            "outputs": x.outputs,
            "seconds": round(x.seconds, 2),
        }
        for x in reports
    ]
    if as_json:
        echo_json({"recipe": recipe, "overrides": r.applied_overrides, "steps": rows})
    else:
        print_table(
            ["step", "uses", "status", "outputs", "seconds"],
            [
                [x["step"], x["uses"], x["status"], " ".join(x["outputs"].values()), x["seconds"]]
                for x in rows
            ],
        )


@click.command(
    epilog="Example:\n\n  trace status recipes/demo.yaml --set steps.ingest_retail.with.on_error=skip"
)
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="steps.ID.with.KEY=VALUE",
    help="Override a step's config, as for `trace run`.",
)
@json_option
@store_option
def status(recipe, overrides, as_json, store_dir):
    """Show, per step, whether it is up to date or would run (nothing is executed)."""
    from trace_cli.recipes import load_recipe, recipe_status

    r = load_recipe(recipe, list(overrides))
    st = open_store(store_dir)
    reports = recipe_status(r, st)
    if as_json:
        echo_json(
            [
                {
                    "step": x.id,
                    "uses": x.uses,
                    "status": x.status,
                    "id": x.artifact_id,
                    "outputs": x.outputs,
                    "detail": x.detail,
                }
                for x in reports
            ]
        )
        return
    print_table(
        ["step", "uses", "status", "id", "detail"],
        [[x.id, x.uses, x.status, x.artifact_id or "", x.detail] for x in reports],
    )

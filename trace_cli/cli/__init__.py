"""The `trace` command: a lazily-loaded click group (no heavy imports until a command runs)."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import traceback

import click

from trace_cli import __version__
from trace_cli.errors import TraceError, terminal_safe

# name -> (module, attribute, one-line summary shown by `trace --help` without importing the module)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "ingest": (
        "trace_cli.cli.ingest",
        "ingest",
        "Import rollouts (τ²-bench results, JSONL episodes) into the store.",
    ),
    "eval": (
        "trace_cli.cli.eval",
        "eval_cmd",
        "Run a model on an environment; write rollouts and pass@1 / pass^k.",
    ),
    "report": (
        "trace_cli.cli.report",
        "report",
        "Write an HTML report with plots of a store (diagnosis, calibration, training, eval).",
    ),
    "export": (
        "trace_cli.cli.export",
        "export",
        "Write rollouts as τ²-bench results JSON or OpenAI-format JSONL.",
    ),
    "diagnose": (
        "trace_cli.cli.diagnose",
        "diagnose",
        "Find capabilities that separate failed from successful rollouts.",
    ),
    "synthesize": (
        "trace_cli.cli.synthesize",
        "synthesize",
        "Build a calibrated training environment per capability.",
    ),
    "train": (
        "trace_cli.cli.train",
        "train",
        "Train a model: SFT base agent or a GRPO LoRA adapter per capability.",
    ),
    "compose": (
        "trace_cli.cli.compose",
        "compose",
        "Combine adapters: task router or token-level top-1 MoE.",
    ),
    "model": (
        "trace_cli.cli.model",
        "model",
        "Build and inspect models (offline tiny Qwen3 models for tests).",
    ),
    "serve": (
        "trace_cli.cli.serve",
        "serve",
        "Serve a model over an OpenAI-compatible API (τ²-bench, LiteLLM, OpenAI SDK).",
    ),
    "run": ("trace_cli.cli.run", "run", "Run a recipe: chain stages, skipping steps that are up to date."),
    "status": (
        "trace_cli.cli.run",
        "status",
        "Show which steps of a recipe are up to date and which would run.",
    ),
    "validate": (
        "trace_cli.cli.validate",
        "validate",
        "Validate YAML/JSON files against their schema (by `kind`).",
    ),
    "store": (
        "trace_cli.cli.store",
        "store",
        "Inspect and maintain the artifact store (ls, show, sql, verify, gc).",
    ),
}


def _available() -> list[str]:
    """Commands whose module is present (stages land one issue at a time)."""
    out = []
    for name, (mod, _attr, _s) in COMMANDS.items():
        spec = importlib.util.find_spec(mod)
        if spec is not None:
            out.append(name)
    return out


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return _available()

    def get_command(self, ctx, name):
        if name not in COMMANDS or name not in _available():
            return None
        mod, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(mod), attr)

    def format_commands(self, ctx, formatter):
        rows = [(n, COMMANDS[n][2]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


_VERBOSE = False


def set_verbose(value: bool) -> None:
    global _VERBOSE
    _VERBOSE = _VERBOSE or bool(value)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    epilog=(
        "Examples:\n\n"
        "  trace ingest tau2 results.json --name gpt41-retail\n\n"
        '  trace store sql "SELECT success, count(*) FROM episodes GROUP BY ALL"\n\n'
        "  trace run recipes/demo.yaml\n\n"
        "Every command has --help with an example. The store is --store DIR, else $TRACE_STORE, else ./store."
    ),
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Show tracebacks on errors.",
    callback=lambda c, p, v: set_verbose(v),
    expose_value=False,
    is_eager=True,
)
@click.version_option(__version__, "--version", prog_name="trace")
def cli():
    """trace — turn an agent's recurring failures into capability-targeted training.

    Stages: ingest/eval -> diagnose -> synthesize -> train -> compose -> eval. Each reads and writes
    schema-validated artifacts in a DuckDB-indexed store; `trace run RECIPE` chains them.

    Exit codes: 0 ok, 1 a stage ran but failed its checks, 2 usage/config/input error, 130 interrupted.
    """


_INTERRUPTED = False


def _on_sigint(signum, frame):
    """Python's default Ctrl-C behaviour, plus a note: libraries (DuckDB) may turn the KeyboardInterrupt
    into their own exception, which must still end as 'interrupted' (exit 130), not as an internal error."""
    global _INTERRUPTED
    _INTERRUPTED = True
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    global _VERBOSE, _INTERRUPTED
    args = list(sys.argv[1:] if argv is None else argv)
    _VERBOSE = os.environ.get("TRACE_VERBOSE") in ("1", "true", "yes")  # per invocation, not sticky
    _INTERRUPTED = False
    llm = sys.modules.get("trace_cli.llm.openai_client")
    if llm is not None:  # an earlier invocation's Ctrl-C (in this process) does not abort this one
        llm.clear_abort()
    previous = None
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        _run(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _close_sandboxes() -> None:
    """On Ctrl-C: end every sandbox now (its processes and directory) and every answer being read from an LLM
    endpoint, so that nothing waits on a module or a server while the interpreter shuts down (it joins the
    threads). Only where one was used (its module is then loaded)."""
    leftovers = sys.modules.get("trace_cli.envs.sandbox.leftovers")
    if leftovers is not None:
        leftovers.close_all()
    llm = sys.modules.get("trace_cli.llm.openai_client")
    if llm is not None:
        llm.abort()


def _run(args: list[str]) -> None:
    try:
        cli.main(args=args, prog_name="trace", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:  # click's form of Ctrl-C
        _close_sandboxes()
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.message = terminal_safe(e.message)  # it may quote a path or value from the command line
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        _close_sandboxes()
        click.echo("interrupted", err=True)
        sys.exit(130)
    except TraceError as e:
        if _VERBOSE:
            traceback.print_exc()
        click.echo(terminal_safe(f"error: {e}"), err=True)
        sys.exit(e.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as e:  # an internal bug: one line by default, the traceback with -v
        if _VERBOSE:
            traceback.print_exc()
        if _INTERRUPTED:  # Ctrl-C that a library re-raised as its own error
            _close_sandboxes()
            click.echo("interrupted", err=True)
            sys.exit(130)
        click.echo(
            terminal_safe(
                f"error: internal error: {type(e).__name__}: {e} (rerun with -v for the traceback)"
            ),
            err=True,
        )
        sys.exit(1)
    sys.exit(0)

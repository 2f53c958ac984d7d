"""`trace serve MODEL_REF`: an OpenAI-compatible server (FastAPI + uvicorn) for τ²-bench, LiteLLM or any client."""

from __future__ import annotations

import json

import click

from trace_cli.cli.common import info, open_store, store_option
from trace_cli.errors import a

# τ²-bench (LiteLLM) against two local servers: the agent under test and a local user simulator. The key
# comes from the environment (LiteLLM's openai/ provider reads $OPENAI_API_KEY); τ²-bench writes the
# --*-llm-args into results.json, so a key there would leak. Temperature 0.0 is τ²-bench's own default,
# stated so the run is greedy whatever the server's defaults.
TAU2 = (
    "export TRACE_SERVE_API_KEY=secret OPENAI_API_KEY=secret\n"
    "  trace serve store://model/AGENT --port 8000 &\n"
    "  trace serve store://model/USER --port 8001 &\n"
    "  tau2 run --domain retail --num-trials 1 --max-concurrency 4 \\\n"
    "    --agent-llm openai/AGENT --agent-llm-args "
    '\'{"api_base": "http://127.0.0.1:8000/v1", "temperature": 0.0}\' \\\n'
    "    --user-llm openai/USER --user-llm-args "
    '\'{"api_base": "http://127.0.0.1:8001/v1", "temperature": 0.0}\''
)


def tau2_command(name: str, host: str, port: int, api_key: str | None) -> str:
    """The τ²-bench command for this server as the agent (key from $OPENAI_API_KEY, never in the args)."""
    args = {"api_base": f"http://{host}:{port}/v1", "temperature": 0.0}
    key = "OPENAI_API_KEY=KEY " if api_key else "OPENAI_API_KEY=none "  # KEY: this server's --api-key
    return (
        f"{key}tau2 run --domain retail --agent-llm openai/{name} --agent-llm-args '{json.dumps(args)}' "
        '--user-llm openai/USER --user-llm-args \'{"api_base": "http://127.0.0.1:PORT2/v1", '
        '"temperature": 0.0}\'  (USER: a second trace serve)'
    )


def _setting_option(key: str, kind):
    """A command-line option for a setting of schemas/serve.v1.json: its default and help come from there."""
    from trace_cli.config.schemas import load_schema

    spec = load_schema("serve.v1.json")["properties"][key]
    text = spec["description"]
    flag = "--" + key.replace("_", "-")
    return click.option(
        flag, type=kind, default=spec["default"], show_default=True, help=f"{text[0].upper()}{text[1:]}."
    )


def served_name(ref: str) -> str:
    """The model id clients send: the artifact's name, a directory's name, or the reference itself."""
    if ref.startswith("store://"):
        return ref.rstrip("/").rsplit("/", 1)[-1]
    return ref.rstrip("/").rsplit("/", 1)[-1] if "/" in ref else ref


@click.command(
    "serve",
    epilog=(
        "Examples:\n\n  trace serve store://model/base --port 8000\n\n"
        "  trace serve store://adapter/precondition --port 8001 --api-key secret\n\n"
        "  trace serve store://composition/router --port 8002\n\n"
        "Clients: the model id is NAME (the artifact's name; --name to change it).\n\n"
        f"\b\nτ²-bench (LiteLLM), agent and user simulator both served locally, offline:\n  {TAU2}\n\n"
        "  trace eval --model 'openai:http://127.0.0.1:PORT/v1?model=NAME' --env shop --seeds 0:50\n\n"
        '  OpenAI SDK:  OpenAI(base_url="http://127.0.0.1:PORT/v1", api_key="KEY")\n\n'
        "Binds to loopback unless --host says otherwise; Ctrl-C stops it cleanly."
    ),
)
@click.argument("model_ref")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--api-key", envvar="TRACE_SERVE_API_KEY", help="Require this bearer key ($TRACE_SERVE_API_KEY)."
)
@click.option("--name", "model_name", help="Model id clients send (default: the artifact or directory name).")
@click.option(
    "--max-tokens", type=click.IntRange(1), default=512, show_default=True, help="Default max_tokens."
)
@click.option(
    "--batch-window-ms",
    type=click.FloatRange(0),
    default=5.0,
    show_default=True,
    help="Unused: requests join the running batch between tokens (kept for old command lines).",
)
@click.option(
    "--max-batch", type=click.IntRange(1), default=32, show_default=True, help="Rows in the running batch."
)
@click.option(
    "--enable-lora",
    is_flag=True,
    help="Load and unload LoRA adapters while serving (vLLM's /v1/load_lora_adapter and "
    "/v1/unload_lora_adapter; a request names an adapter by its lora_name): the `server` rollout engine "
    "of trace train/eval/synthesize. A plain model only.",
)
@_setting_option("prefix_cache_mib", click.FloatRange(0))
@_setting_option("prefill_chunk", click.IntRange(0))
@store_option
def serve(
    model_ref,
    host,
    port,
    api_key,
    model_name,
    max_tokens,
    batch_window_ms,
    max_batch,
    enable_lora,
    prefix_cache_mib,
    prefill_chunk,
    store_dir,
):
    """Serve a model (store://model/NAME, store://adapter/NAME, store://composition/NAME, an HF dir) at
    /v1/chat/completions.

    Tool calls come back in OpenAI's `tool_calls` format, parsed with the model's own tool-call parser;
    tool_choice "required" or a named function prefills the call. Requests join the running batch between
    tokens (continuous batching), streams send tokens as they are made, a client that disconnects stops its
    generation, and a prompt that does not fit the context gets HTTP 400 context_length_exceeded. One log line
    per request goes to stderr. A composition routes as it does in eval (a
    router decides on the request's messages and names its choice in the x-trace-route response header).
    """
    import socket

    from trace_cli.compose.policy import load_policy
    from trace_cli.errors import UsageError
    from trace_cli.models.refs import resolve_model

    ref = resolve_model(model_ref, open_store(store_dir))
    if enable_lora and ref.kind != "hf":
        raise UsageError(
            f"--enable-lora: {model_ref!r} is {a(ref.kind)}; adapters are loaded onto a plain model",
            hint="serve the base model (store://model/NAME) with --enable-lora and load the adapter into it",
        )
    if ref.kind not in ("hf", "adapter", "composition"):
        raise UsageError(
            f"{model_ref!r} is {a(ref.kind)} reference; trace serve serves local models, adapters and "
            "compositions"
        )
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise UsageError(
                f"cannot listen on {host}:{port}: {e.strerror}", hint="choose another --port"
            ) from None
    import uvicorn

    from trace_cli.serve.app import create_app
    from trace_cli.serve.engine import Engine

    name = model_name or served_name(model_ref)
    policy = load_policy(ref, temperature=0.0, max_new_tokens=max_tokens)
    engine = Engine(
        policy,
        name,
        window_s=batch_window_ms / 1000,
        max_batch=max_batch,
        prefix_cache_mib=prefix_cache_mib,
        prefill_chunk=prefill_chunk,
        enable_lora=enable_lora,
    )
    app = create_app(engine, api_key=api_key, default_max_tokens=max_tokens)
    import logging
    import sys

    log = logging.getLogger("trace.serve")  # one line per request (serve.app)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    if host not in ("127.0.0.1", "localhost", "::1"):
        info(f"warning: listening on {host}, not loopback: anyone who can reach it can use the model")
    info(f"serving {ref.display} as {name!r} at http://{host}:{port}/v1")
    if enable_lora:
        info("LoRA adapters: POST /v1/load_lora_adapter {lora_name, lora_path}; requests name them as model")
    info(f"τ²-bench: {tau2_command(name, host, port, api_key)}")
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    info("server stopped")  # Ctrl-C is how a server is meant to stop: exit 0

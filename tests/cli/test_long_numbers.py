"""Integers too long for Python to convert (more than 4300 digits) in any input are a clear error naming the
input, never an internal one (issue 46, item 6): a JSONL record, a config or recipe file, an environment URI,
and a model's tool call (a malformed action)."""

from __future__ import annotations

from trace_testing import run_trace

from trace_cli.models.toolcalls import parse

BIG = "9" * 5000


def _clear(r, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "internal error" not in r.stderr and "set_int_max_str_digits" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_a_jsonl_record_with_a_long_number(tmp_path):
    f = tmp_path / "e.jsonl"
    f.write_text(
        '{"episode_id": "e1", "task_id": "t", "reward": ' + BIG + ', "success": true, '
        '"messages": [{"role": "user", "content": "hi"}]}\n'
    )
    r = run_trace("ingest", "jsonl", f, "--store", tmp_path / "store")
    _clear(r, "line 1", "longer than 4300 digits")


def test_a_config_with_a_long_number(tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"seed: {BIG}\n")
    r = run_trace(
        "eval",
        "--config",
        cfg,
        "--env",
        "shop",
        "--model",
        "policy:reference",
        "--seeds",
        "0:1",
        "--store",
        tmp_path / "store",
    )
    _clear(r, str(cfg), "longer than 4300 digits")


def test_a_recipe_with_a_long_number(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"steps: []\nseed: {BIG}\n")
    r = run_trace("run", recipe, "--store", tmp_path / "store")
    _clear(r, "longer than 4300 digits")


def test_an_environment_uri_with_a_long_number(tmp_path):
    r = run_trace(
        "eval",
        "--env",
        f"shop?max_turns={BIG}",
        "--model",
        "policy:reference",
        "--seeds",
        "0:1",
        "--store",
        tmp_path / "store",
    )
    _clear(r, "longer than 4300 digits")


def test_a_tool_call_with_a_long_number_is_a_malformed_action():
    """A model's output is untrusted: in every tool-call format a number too long to read is a malformed call."""
    for fmt, text in (
        ("hermes", '<tool_call>{"name": "f", "arguments": {"n": ' + BIG + "}}</tool_call>"),
        ("llama3-json", '{"name": "f", "parameters": {"n": ' + BIG + "}}"),
        ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"n": ' + BIG + "}}]"),
    ):
        calls = parse(text, fmt)
        assert calls and any("malformed" in c for c in calls), (fmt, calls)

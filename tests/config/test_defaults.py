"""One owner per config key: the schemas under schemas/config/ state every default, and no Python code below the
stages states one again, the same (a copy that drifts) or another (a silent disagreement).

The scan reads every module of the layers below `stages` with `ast`: a parameter named as a config key whose
schema states a default, with a literal default of its own other than None (None means "not given"), and a
`.get("key", literal)` fallback on such a key. A name that is not the config key where it stands is listed in
NOT_THE_KEY with the reason."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

import trace_cli
from trace_cli.config.sampling import SCHEMA_BLOCKS, SamplingSettings
from trace_cli.config.schemas import load_schema

PKG = Path(trace_cli.__file__).parent
BELOW_STAGES = [
    "training",
    "compose",
    "agents",
    "envs",
    "formats",
    "analysts",
    "llm",
    "models",
    "store",
    "config",
]

# "module:function:name": why that name is not the config key of the same name
NOT_THE_KEY = {
    "analysts/cache.py:ResponseCache.for_store:enabled": "whether responses are cached, not lora.enabled",
    "envs/tau2/__init__.py:.get:max_steps": "τ²-bench's message budget (tau2-retail?max_steps=…), not GRPO's steps",
    "compose/moe_train.py:routing_accuracy:batch_size": "an evaluation batch, not compose's training one",
    "envs/rollout.py:rollout:batch_size": "episodes in flight at once (a throughput knob of the loop)",
    "envs/corpus.py:sample_episodes:seeds": "a count of replayed seeds, not a stage's seed range",
    "envs/worlds/tasks.py:world:weights": "the shop world's order mix, not diagnose's weights",
    "models/refs.py:.get:deficits": "a parsed query string of a policy reference",
    "training/sft.py:tokenize:loss_on": "the tokenizer's own mode; the stage passes its config value",
    "envs/shop/env.py:ShopEnv.demonstration:deficits": "an episode's deficits (none: the reference)",
    "compose/moe.py:attach:context": "gates read the running context: the layer's own switch",
    "envs/synthetic/base.py:SyntheticEnv.__init__:hint_share": "the admitted environment's hint share (0: none)",
    "envs/synthetic/calibrate.py:.get:hint_share": "an attempt's own hint share (none until the search adds it)",
    "envs/synthetic/calibrate.py:Attempt:hint_share": "the share of an attempt's rollouts that saw the hint (a record)",
    "compose/moe.py:RoutingTrace:context": "whether the gates read the running context: the layer's own switch",
    # an `openai:` model reference's own URL parameters (parse_ref's syntax, like `shop?max_turns=16`); the
    # analyst builds its Endpoint from its `llm` block, every field given
    "llm/openai_client.py:Endpoint:api_key_env": "an openai: reference's own parameter, not the llm block's",
    "llm/openai_client.py:Endpoint:max_retries": "an openai: reference's own parameter, not the llm block's",
    "llm/openai_client.py:Endpoint:concurrency": "an openai: reference's own parameter, not the llm block's",
    "llm/openai_client.py:Endpoint:max_answer_mb": "an openai: reference's own parameter, not the llm block's",
    # an environment's own cap on its steps is a parameter of the environment (its URI, `shop?max_turns=16`, or
    # environment.v1.json, which requires it): part of the task it poses, owned by the environment, not by a stage's
    # rollout cap (`max_turns` of eval/synthesize/train/compose, enforced by `envs.rollout`)
    "envs/shop/env.py:ShopEnv.__init__:max_turns": "the shop environment's own step cap (an environment parameter)",
    "envs/shop/env.py:ShopMixedEnv.__init__:max_turns": "the mixed shop's own step cap (an environment parameter)",
    "envs/ladder/__init__.py:ShopLadderEnv.__init__:max_turns": "the ladder's own turn cap (an environment parameter)",
    "envs/ladder/__init__.py:ShopLadderEnv.demonstration:deficits": "an episode's deficits (none: the reference)",
    "envs/synthetic/base.py:SyntheticEnv.__init__:max_turns": "a template's own step cap (an environment parameter)",
}


def schema_defaults() -> dict[str, set[str]]:
    """Every config key that has a default in some stage schema -> those defaults (as JSON)."""
    out: dict[str, set[str]] = {}

    def walk(node) -> None:
        if isinstance(node, dict):
            for key, sub in (node.get("properties") or {}).items():
                if isinstance(sub, dict) and "default" in sub:
                    out.setdefault(key, set()).add(json.dumps(sub["default"]))
            for sub in node.values():
                walk(sub)
        elif isinstance(node, list):
            for sub in node:
                walk(sub)

    for path in sorted((PKG / "schemas" / "config").glob("*.json")):
        walk(json.loads(path.read_text()))
    return out


def _qualified(tree: ast.AST) -> dict[ast.AST, str]:
    """Each function node -> its name qualified by its classes (`Policy.__init__`)."""
    names: dict[ast.AST, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names[child] = prefix + child.name
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return names


def stated_defaults(path: Path, keys: set[str]) -> Iterator[tuple[str, str, int, object]]:
    """(function, name, line, value) of every literal default or `.get` fallback on one of `keys`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    qualified = _qualified(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=True))
            pairs += [(x, d) for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
            for arg, default in pairs:
                if arg.arg in keys:
                    yield from _literal(qualified[node], arg.arg, default)
        elif isinstance(node, ast.ClassDef) and any(_is_dataclass(d) for d in node.decorator_list):
            for item in node.body:  # a dataclass field's default is its __init__ parameter's default
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and item.value is not None
                ):
                    if item.target.id in keys:
                        yield from _literal(qualified[node], item.target.id, item.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in keys
        ):
            yield from _literal(".get", node.args[0].value, node.args[1])


def _is_dataclass(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Name) and target.id == "dataclass") or (
        isinstance(target, ast.Attribute) and target.attr == "dataclass"
    )


def _literal(function: str, name: str, node: ast.expr) -> Iterator[tuple[str, str, int, object]]:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return
    if value is not None:
        yield function, name, node.lineno, value


def found() -> dict[str, str]:
    keys = schema_defaults()
    out = {}
    for pkg in BELOW_STAGES:
        for path in sorted((PKG / pkg).rglob("*.py")):
            rel = path.relative_to(PKG).as_posix()
            for function, name, line, value in stated_defaults(path, set(keys)):
                how = "restates" if json.dumps(value) in keys[name] else "differs from"
                out[f"{rel}:{function}:{name}"] = (
                    f"trace_cli/{rel}:{line} {function}: {name}={value!r} {how} the schema's {sorted(keys[name])}"
                )
    return out


def test_no_python_default_below_the_stages_restates_or_contradicts_a_schema_default():
    stated = found()
    bad = [why for where, why in sorted(stated.items()) if where not in NOT_THE_KEY]
    assert not bad, "config defaults stated again below the stages:\n" + "\n".join(bad)
    stale = sorted(set(NOT_THE_KEY) - set(stated))
    assert not stale, f"no longer stated, remove from this test's lists: {stale}"


def test_the_scan_sees_parameters_keyword_only_parameters_and_get_fallbacks(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "def f(a, max_turns=12, *, top_p=0.9, seed=None):\n"
        "    return cfg.get('temperature', 0.7), cfg.get('other', 1)\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class P:\n"
        "    seed: int = 3\n"
        "    top_p: float | None = None\n"
    )
    got = {
        (fn, name, value)
        for fn, name, _, value in stated_defaults(f, {"max_turns", "top_p", "seed", "temperature"})
    }
    assert got == {
        ("f", "max_turns", 12),
        ("f", "top_p", 0.9),
        (".get", "temperature", 0.7),
        ("P", "seed", 3),
    }


@pytest.mark.parametrize("stage", sorted(SCHEMA_BLOCKS))
def test_sampling_settings_are_the_schema_keys_and_declare_no_default(stage):
    """Each field is a key of the stage's schema (its block, or the top level) with a default there; the class
    holds none of its own (the schema's is the one)."""
    schema = load_schema(f"config/{stage}.v1.json")
    block = schema
    for key in SCHEMA_BLOCKS[stage]:
        block = block["properties"][key]
    for f in fields(SamplingSettings):
        assert f.default is MISSING and f.default_factory is MISSING, f.name
        where = block["properties"].get(f.name) or schema["properties"].get(f.name)
        if f.name == "max_completion_length" and stage == "eval":
            assert where is None  # eval gives no episode budget: the field is None there
            continue
        assert where is not None and "default" in where, (stage, f.name)


def test_grpo_spec_declares_no_default_for_a_train_key():
    from trace_cli.training.grpo_spec import GRPOSpec

    keys = set(load_schema("config/train.v1.json")["properties"])
    with_default = [
        f.name
        for f in fields(GRPOSpec)
        if f.name in keys and (f.default is not MISSING or f.default_factory is not MISSING)
    ]
    assert with_default == []


def test_one_cross_field_check_for_every_stage_that_samples():
    from trace_cli.errors import UsageError

    block = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 200, "max_completion_length": 100}
    with pytest.raises(UsageError, match="max_new_tokens .200. exceeds max_completion_length .100."):
        SamplingSettings.of(block, max_turns=12)
    ok = SamplingSettings.of({**block, "max_completion_length": None}, max_turns=12)
    assert ok.reuse_key("d") == {
        "model_digest": "d",
        "temperature": 1.0,
        "top_p": 1.0,
        "max_new_tokens": 200,
        "max_completion_length": None,
        "max_turns": 12,
    }


def test_compose_samples_its_generated_transcripts_as_its_schema_says():
    """moe's generated data: the policy's sampling comes from compose's `moe` block (greedy, 128 new tokens per
    turn by default), `max_turns` from the same block."""
    moe = load_schema("config/compose.v1.json")["properties"]["moe"]["properties"]
    block = {k: v["default"] for k, v in moe.items() if "default" in v}
    settings = SamplingSettings.of(block)
    assert settings.policy_kwargs() == {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 128}
    assert settings.max_turns == 20 and settings.max_completion_length is None

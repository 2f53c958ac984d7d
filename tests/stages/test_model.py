"""`trace model init`: an offline Qwen3-architecture model + byte-level BPE tokenizer as a `model` artifact."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
import tinymodel  # noqa: E402
from tinymodel import CONFIG  # noqa: E402
from trace_testing import run_cli, snapshot  # noqa: E402

from trace_cli.models.builder import MARKUP  # noqa: E402
from trace_cli.store import Store  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tinymodel.tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model.hf)


def test_artifact_loads_with_auto_classes(tiny_model, tok):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    art = Store(tiny_model.store_root).get("model", tiny_model.id)
    assert art.kind == "model" and art.path / "hf" == tiny_model.hf
    cfg = AutoConfig.from_pretrained(tiny_model.hf)
    assert cfg.model_type == "qwen3"
    model = AutoModelForCausalLM.from_pretrained(tiny_model.hf)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    n_params = sum(p.numel() for p in model.parameters())
    assert art.summary["parameters"] == n_params < 1_000_000
    assert cfg.vocab_size == len(tok) == art.summary["vocab_size"]
    assert cfg.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
    assert tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    ids = tok("hello world", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))


def _texts() -> list[str]:
    rng = random.Random(0)
    alphabet = 'abcXYZ019 \t\n{}[]":,.#@_-éüßñøç日本語中文한국어😀🎉👍🏽\u200b\x00\x7f'
    random_texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(30)]
    return [
        "",
        " ",
        "  leading and trailing spaces  ",
        "line1\nline2\r\nline3\n\n\n",
        json.dumps(
            {"name": "refund", "arguments": {"order_id": "#W1234567", "amount": 12.5, "items": [1, 2]}}
        ),
        json.dumps({"city": "Zürich", "note": "東京 ✓ 🎉"}, ensure_ascii=False),
        json.dumps({"escaped": 'Zürich \\ " \n'}),
        "Order #W0000001 costs $1,234.56 (0.001% off) on 2024-02-29.",
        '<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>',
        "<|im_start|>assistant\n<think>\n\n</think>\n\nHi<|im_end|>",
        "\ufffd broken \udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
        *random_texts,
    ]


def test_tokenizer_round_trips_arbitrary_text(tok):
    for text in _texts():
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text, repr(text)
    # digits never merge with what surrounds them: ids and amounts are copied digit group by digit group
    for text in ("#W1234567", "costs 1,234.56 dollars", "user_id 98765x"):
        for piece in tok.tokenize(text):
            assert piece.isdigit() or not any(c.isdigit() for c in piece), (text, piece)


def test_markup_tokens_are_single_non_special_tokens(tok):
    special = set(tok.all_special_tokens)
    for m in MARKUP:
        ids = tok(m, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, (m, ids)
        assert m not in special and ids[0] not in tok.all_special_ids
        # glued to other text, the markup still is one token
        glued = tok(f"x{m}y", add_special_tokens=False)["input_ids"]
        assert ids[0] in glued
    text = '<think>\n\n</think>\n\n<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>'
    ids = tok(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
    # what TRL does with completions: special tokens go, tool-call markup stays
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert "<|im_end|>" in special and "<|endoftext|>" in special


def test_chat_template_is_trls_qwen3_template_byte_for_byte(tiny_model, tok):
    spec = importlib.util.find_spec("trl")
    trl_file = Path(list(spec.submodule_search_locations)[0]) / "chat_templates" / "qwen3.jinja"
    stored = tiny_model.hf / "chat_template.jinja"
    assert stored.read_bytes() == trl_file.read_bytes()
    assert tok.chat_template == trl_file.read_text(encoding="utf-8")
    # tool calls render as <tool_call>{json}</tool_call>
    msgs = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
        },
    ]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>' in text


def test_same_config_same_id_and_skipped(tiny_model):
    root = tiny_model.store_root
    before = snapshot(root)
    r = run_cli(
        "model",
        "init",
        "--preset",
        "tiny",
        "--corpus-seeds",
        str(CONFIG["corpus_seeds"]),
        "--store",
        root,
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["skipped"] is True and doc["id"] == tiny_model.id
    assert Path(doc["path"]) == tiny_model.hf
    assert snapshot(root) == before
    # explicit defaults are the same config; any real change is a new id (checked without building)
    from trace_cli.stages import get_stage

    stage = get_stage("model")
    store = Store(root)
    assert stage.prepare({**CONFIG, "seed": 0, "envs": ["shop"]}, store).id == tiny_model.id
    assert stage.prepare({**CONFIG, "seed": 1}, store).id != tiny_model.id
    assert stage.prepare({**CONFIG, "preset": "small"}, store).id != tiny_model.id
    assert stage.prepare({**CONFIG, "arch": {"num_hidden_layers": 3}}, store).id != tiny_model.id


def test_id_follows_the_code_that_builds(tiny_model, monkeypatch):
    """Presets and the builder are code: when they change, the same config must not find the old build."""
    from trace_cli.models import builder
    from trace_cli.stages import get_stage

    stage, store = get_stage("model"), Store(tiny_model.store_root)
    assert stage.prepare(dict(CONFIG), store).id == tiny_model.id
    monkeypatch.setitem(builder.PRESETS, "tiny", {**builder.PRESETS["tiny"], "vocab_size": 2048})
    assert stage.prepare(dict(CONFIG), store).id != tiny_model.id
    monkeypatch.undo()
    monkeypatch.setattr(builder, "BUILDER_VERSION", builder.BUILDER_VERSION + 1)
    assert stage.prepare(dict(CONFIG), store).id != tiny_model.id


def test_model_show_resolves_dirs_and_artifacts(tiny_model):
    r = run_cli("model", "show", str(tiny_model.hf), "--json", "--store", tiny_model.store_root)
    assert r.exit_code == 0, r.output
    by_dir = json.loads(r.stdout)
    assert by_dir["kind"] == "hf" and Path(by_dir["path"]) == tiny_model.hf.resolve()
    r = run_cli("model", "show", tiny_model.uri, "--json", "--store", tiny_model.store_root)
    assert r.exit_code == 0, r.output
    by_uri = json.loads(r.stdout)
    assert by_uri["kind"] == "hf" and Path(by_uri["path"]) == tiny_model.hf
    assert by_uri["digest"]  # the artifact digest (content identity)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "nope"], "unknown environment"),
        (["--corpus-seeds", "0"], "corpus_seeds"),
        (["--preset", "huge"], "huge"),
    ],
)
def test_model_init_bad_input_exit_2_nothing_written(tmp_path, args, message):
    root = tmp_path / "store"
    r = run_cli("model", "init", *args, "--store", root)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert snapshot(root) == []

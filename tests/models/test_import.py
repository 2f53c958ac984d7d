"""`trace model import`: HF directories (own template or a named built-in), bad sources, the offline SmolLM2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from trace_testing import run_cli  # noqa: E402

from trace_cli.models.importer import META_FILE, renders_tools  # noqa: E402

PLAIN_CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def plain_dir(tiny_model, tmp_path_factory):
    """The tiny model with SmolLM2's kind of template: ChatML that ignores tools."""
    d = tmp_path_factory.mktemp("plain") / "hf"
    shutil.copytree(tiny_model.hf, d)
    (d / "chat_template.jinja").write_text(PLAIN_CHATML)
    (d / "README.md").write_text("---\nlicense: apache-2.0\n---\n# a model\n")
    return d


def _stored_dtypes(hf_dir: Path) -> set[str]:
    """The dtypes of the tensors in a checkpoint's safetensors files, read from their headers."""
    import struct

    out: set[str] = set()
    for f in hf_dir.glob("*.safetensors"):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        out |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    return out


def test_an_hf_checkpoint_keeps_its_dtype(tiny_model, tmp_path):
    """A bf16 checkpoint is imported as bf16 (its config's dtype), not widened to float32."""
    import torch
    from transformers import AutoModelForCausalLM

    src = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model.hf, dtype=torch.bfloat16).save_pretrained(src)
    for f in tiny_model.hf.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, src / f.name)
    r = _import(tmp_path / "s", str(src), "--name", "b")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["dtype"] == "bfloat16"
    from trace_cli.store import Store

    assert _stored_dtypes(Store(tmp_path / "s").resolve("store://model/b").path / "hf") == {"BF16"}
    r = _import(tmp_path / "s", str(tiny_model.hf), "--name", "f")  # a float32 source stays float32
    assert r.exit_code == 0, r.stderr
    assert _stored_dtypes(Store(tmp_path / "s").resolve("store://model/f").path / "hf") == {"F32"}


def _import(store, *args):
    return run_cli("model", "import", *args, "--store", store, "--json")


def test_own_template_is_kept_when_it_renders_tools(tiny_model, tmp_path):
    r = _import(tmp_path / "s", str(tiny_model.hf), "--name", "mine")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    s = doc["summary"]
    assert s["chat_template"] == "own" and s["tool_format"] == "hermes" and s["prefix_preserving"]
    assert s["source_kind"] == "hf" and len(s["source_digest"]) == 64 and s["licence"] == "unknown"
    assert s["stop_tokens"] == ["<|im_end|>"]
    meta = json.loads((Path(doc["path"]) / META_FILE).read_text())
    assert meta["kind"] == "pretrained"
    # same source, same config -> same artifact (skipped)
    again = json.loads(_import(tmp_path / "s", str(tiny_model.hf)).stdout)
    assert again["id"] == doc["id"] and again["skipped"]


def test_template_without_tools_needs_a_builtin(plain_dir, tmp_path):
    r = _import(tmp_path / "s", str(plain_dir))
    assert r.exit_code == 2 and "does not render tools" in r.stderr and "--chat-template" in r.stderr
    assert not (tmp_path / "s" / "model").exists() or not any((tmp_path / "s" / "model").iterdir())
    r = _import(tmp_path / "s", str(plain_dir), "--chat-template", "hermes")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["licence"] == "apache-2.0" and doc["summary"]["chat_template"] == "hermes"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(doc["path"])
    assert renders_tools(tok, tok.chat_template)  # the saved template is the one used, and renders tools
    assert (Path(doc["path"]) / "chat_template.jinja").read_text() == tok.chat_template


def test_builtin_whose_turn_end_is_not_a_token_is_refused(plain_dir, tmp_path):
    r = _import(tmp_path / "s", str(plain_dir), "--chat-template", "llama3-json")
    assert r.exit_code == 2 and "<|eot_id|>" in r.stderr


@pytest.mark.parametrize(
    "source,msg",
    [("no/such/dir", "not found"), ("README.md", ".gguf"), ("smollm2-999m", "not found")],
)
def test_bad_sources_exit_2(source, msg, tmp_path):
    r = _import(tmp_path / "s", source)
    assert r.exit_code == 2 and msg in r.stderr


@pytest.mark.slow
def test_smollm2_builtin_imports_offline(tmp_path):
    """The acceptance path: the wheel's GGUF, dequantised; hermes template; its tool calls are parsed."""
    r = _import(tmp_path / "s", "smollm2-135m-instruct", "--name", "smol")
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["licence"] == "Apache-2.0" and s["source_kind"] == "builtin" and s["chat_template"] == "hermes"
    assert s["prefix_preserving"] and s["context"] == 8192 and s["stop_tokens"] == ["<|im_end|>"]
    # bf16 weights, as upstream (not float32: that would double an 8B model to 32 GB)
    from trace_cli.store import Store

    art = Store(tmp_path / "s").resolve("store://model/smol")
    assert s["dtype"] == "bfloat16"
    assert _stored_dtypes(art.path / "hf") == {"BF16"}
    assert json.loads((art.path / "hf" / "config.json").read_text()).get("dtype") == "bfloat16"

"""Defaults per model kind (issue 12): an imported checkpoint gets LoRA SFT at 3e-4 with max_length from the
demonstrations (dropped ones counted), a from-scratch preset keeps its toy values; the SFT model carries the
template it was trained with and the import's meta; a template that breaks prefixes is refused before training."""

from __future__ import annotations

import json
import shutil

import pytest
import tinymodel  # noqa: E402

from trace_cli.errors import UsageError  # noqa: E402
from trace_cli.stages.base import execute  # noqa: E402
from trace_cli.store import Store  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tinymodel.tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def imported(tiny, tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("kinds") / "store")
    out = execute("model", {"source": str(tiny.hf)}, store, name="imp")
    return store, out.main


def _sft(model, **over):
    return {"method": "sft", "env": "shop", "model": model, "seeds": "100000:100003", **over}


def test_preset_keeps_toy_defaults(tiny):
    from trace_cli.stages.train import prepare

    cfg = prepare(_sft(str(tiny.hf)), Store(tiny.store_root)).config
    assert cfg["learning_rate"] == 0.002 and cfg["max_length"] == 1024 and not cfg.get("lora")


def test_imported_gets_real_model_defaults(imported):
    from trace_cli.stages.train import prepare

    store, art = imported
    cfg = prepare(_sft(art.uri), store).config
    assert cfg["learning_rate"] == 3e-4 and cfg["max_length"] is None
    assert cfg["lora"] == {
        "r": 16,
        "alpha": 16,
        "dropout": 0.0,
        "target_modules": "all-linear",
        "enabled": True,
    }
    cfg = prepare(_sft(art.uri, learning_rate=0.01, max_length=600, lora={"enabled": False}), store).config
    assert cfg["learning_rate"] == 0.01 and cfg["max_length"] == 600 and not cfg["lora"]["enabled"]
    g = prepare(
        {
            **_sft(art.uri, method="grpo"),
            "num_generations": 2,
            "per_device_batch_size": 2,
            "gradient_accumulation_steps": 1,
        },
        store,
    )
    assert g.config["learning_rate"] == 1e-5 and g.config["lora"]["r"] == 16


def test_sft_on_imported_model_counts_drops_and_keeps_template(imported):
    store, art = imported
    out = execute("train", _sft(art.uri, batch_size=1, max_length=700), store)
    s = out.main.summary
    assert s["demonstrations"] + s["dropped_demonstrations"] == 3 and s["dropped_demonstrations"] >= 1
    assert s["max_length"] <= 700 and s["context"] == 4096 and s["learning_rate"] == 3e-4
    hf = out.main.path / "hf"
    assert json.loads((hf / "trace_model.json").read_text())["kind"] == "pretrained"
    assert (hf / "chat_template.jinja").read_text() == (art.path / "hf" / "chat_template.jinja").read_text()
    auto = execute("train", _sft(art.uri, batch_size=1, epochs=0.34), store).main.summary
    assert auto["dropped_demonstrations"] == 0 and auto["max_length"] > 700  # what the demos need


def test_template_that_breaks_prefixes_is_refused(tiny, tmp_path):
    d = tmp_path / "hf"
    shutil.copytree(tiny.hf, d)
    # a template whose opening depends on the conversation's length (as templates that, e.g., number turns
    # or drop earlier reasoning do): the prompt at a turn is not a prefix of the transcript
    bad = "{{- messages|length|string }}" + (tiny.hf / "chat_template.jinja").read_text()
    (d / "chat_template.jinja").write_text(bad)
    with pytest.raises(UsageError, match="not prefix-preserving"):
        execute("train", _sft(str(d)), Store(tmp_path / "store"))

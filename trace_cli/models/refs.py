"""Model references: `policy:reference|random`, store artifacts (model, adapter), local HF dirs, hub ids, and
OpenAI-compatible endpoints (`openai:http://HOST:PORT/v1?model=NAME`).

`resolve_model()` is cheap (no weights loaded) so stages can validate references before any compute;
`load_hf()` loads an hf or adapter reference's weights, and compose.policy.load_policy makes any reference a
policy (it needs the agents and compositions, which live above this layer).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_cli.errors import NotFoundError, UsageError, a
from trace_cli.store import Store

BUILTIN_POLICIES = ("policy:reference", "policy:random")  # + policy:demonstration?deficits=a,b&rate=0.9
# what an "unknown policy" message lists: every built-in, the parameterised one with its form
KNOWN_POLICIES = (*BUILTIN_POLICIES, "policy:demonstration?deficits=a,b&rate=0.9")


def demonstration_params(ref: str) -> tuple[set[str], float]:
    """`policy:demonstration?deficits=a,b&rate=0.9` -> ({a, b}, 0.9)."""
    from urllib.parse import parse_qsl

    base, _, query = ref.partition("?")
    if base != "policy:demonstration":
        raise UsageError(f"unknown built-in policy {ref!r}; expected one of {', '.join(KNOWN_POLICIES)}")
    params = dict(parse_qsl(query))
    unknown = set(params) - {"deficits", "rate"}
    if unknown:
        raise UsageError(
            f"{ref!r}: unknown parameter(s) {', '.join(sorted(unknown))} (expected deficits, rate)"
        )
    deficits = {d for d in params.get("deficits", "").split(",") if d}
    try:
        rate = float(params.get("rate", 1.0))
    except ValueError:
        raise UsageError(f"{ref!r}: rate must be a number in [0, 1]") from None
    if not 0.0 <= rate <= 1.0:
        raise UsageError(f"{ref!r}: rate must be a number in [0, 1]")
    return deficits, rate


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
_BIG = 64 << 20


@dataclass
class ModelRef:
    kind: str  # builtin | hf | adapter | composition | openai
    display: str
    digest: str
    path: Path | None = None  # the HF model dir (base model for adapters)
    adapter_path: Path | None = None
    artifact_id: str | None = None
    artifact_kind: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_input(self, role: str = "model") -> dict[str, Any]:
        d: dict[str, Any] = {"role": role, "digest": self.digest}
        if self.artifact_id:
            d.update(id=self.artifact_id, kind=self.artifact_kind)
        elif self.path is not None:
            d["path"] = str(self.path)
        return d


def dir_digest(path: Path) -> str:
    """Content identity of a model dir: sha256 of small files, (name, size, head, tail) of big ones."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if not p.is_file():
            continue
        h.update(p.relative_to(path).as_posix().encode())
        size = p.stat().st_size
        h.update(str(size).encode())
        with open(p, "rb") as f:
            if size <= _BIG:
                h.update(f.read())
            else:
                h.update(f.read(1 << 20))
                f.seek(-(1 << 20), os.SEEK_END)
                h.update(f.read())
    return h.hexdigest()


def has_tokenizer(path: Path) -> bool:
    return any((Path(path) / f).is_file() for f in TOKENIZER_FILES)


def check_hf_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise UsageError(f"{path}: not a Hugging Face model directory (no config.json)")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise UsageError(
            f"{path}: model directory has no tokenizer ({', '.join(TOKENIZER_FILES[:2])} missing)",
            hint="save the tokenizer next to the model with tokenizer.save_pretrained(dir)",
        )
    check_safe_weights(path)


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def check_safe_weights(path: Path) -> None:
    """Weights are loaded from safetensors only: a pickle (pytorch_model.bin, *.pt, *.pkl) can run arbitrary
    code when unpickled, so a directory with only pickled weights is refused (exit 2) with the way out."""
    if any(path.glob("*.safetensors")):
        return
    pickled = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if pickled:
        raise UsageError(
            f"{path}: the weights are pickled ({', '.join(pickled[:3])}); trace loads safetensors only, "
            "because unpickling a file can run arbitrary code",
            hint='convert them once, in an environment you trust: python -c "from transformers import '
            "AutoModelForCausalLM as M; M.from_pretrained('DIR').save_pretrained('DIR', "
            'safe_serialization=True)"',
        )
    raise UsageError(
        f"{path}: model directory has no weights (no *.safetensors file)",
        hint="save the model with model.save_pretrained(dir) (safetensors), or pass the directory that holds them",
    )


def resolve_model(ref: str, store: Store | None = None) -> ModelRef:
    if not isinstance(ref, str) or not ref:
        raise UsageError(
            "a model reference is required (store://model/NAME, a local dir, or policy:reference)"
        )
    if ref.startswith("openai:"):
        from trace_cli.llm.openai_client import parse_ref

        ep = parse_ref(ref)  # validated now; nothing is contacted until the policy acts
        # identity = endpoint + model (what is served there may change: re-run with --force)
        return ModelRef(
            "openai", ep.display, hashlib.sha256(ep.display.encode()).hexdigest(), extra={"ref": ref}
        )
    if ref.startswith("policy:demonstration"):
        demonstration_params(ref)  # validate now
        return ModelRef("builtin", ref, hashlib.sha256(ref.encode()).hexdigest())
    if ref in BUILTIN_POLICIES:
        return ModelRef("builtin", ref, hashlib.sha256(ref.encode()).hexdigest())
    if ref.startswith("policy:"):
        raise UsageError(f"unknown built-in policy {ref!r}; expected one of {', '.join(KNOWN_POLICIES)}")
    p = Path(ref)
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"{ref}: a model reference must be a directory, not a file")
        check_hf_dir(p)
        return ModelRef("hf", str(p), dir_digest(p), path=p.resolve())
    if store is not None and (
        ref.startswith("store://") or not ("/" in ref and not ref.startswith("store://"))
    ):
        try:
            art = store.resolve(ref)
        except NotFoundError:
            if ref.startswith("store://"):
                raise
            art = None
        if art is not None:
            if art.kind == "model":
                check_hf_dir(art.path / "hf")
                return ModelRef(
                    "hf", art.uri, art.digest, path=art.path / "hf", artifact_id=art.id, artifact_kind="model"
                )
            if art.kind in ("adapter", "composition"):  # composition: adapters combined by `trace compose`
                base_ref = adapter_base(art, store)
                extra = {"base": base_ref.display}
                if art.kind == "composition":  # its gates / merged weights were built on that exact base
                    extra["base_digest"] = base_ref.digest
                return ModelRef(
                    art.kind,
                    art.uri,
                    art.digest,
                    path=base_ref.path,
                    adapter_path=art.path / "adapter" if art.kind == "adapter" else art.path,
                    artifact_id=art.id,
                    artifact_kind=art.kind,
                    extra=extra,
                )
            raise UsageError(f"{ref!r} is {a(art.kind)} artifact, not a model, adapter or composition")
    if "/" in ref and not ref.startswith(("store://", ".", "/")):
        return _hub(ref)
    raise NotFoundError(f"model {ref!r} not found: not a store artifact, a local directory or a hub id")


def adapter_base(art, store: Store) -> ModelRef:
    """The base model an adapter artifact was trained on. Tried in order: the base model artifact by id
    (`summary.base_model_uri`: survives a moved store and renamed aliases), the HF dir it was loaded from
    (`summary.base_model_path`), the reference as configured (`config.model`). A candidate is accepted only if
    its content digest equals the one recorded as the adapter's `model` input, so an alias that now points at
    another model is never silently used."""
    summary = art.manifest.get("summary", {})
    want = next((i.get("digest") for i in art.manifest.get("inputs", []) if i.get("role") == "model"), None)
    tried: list[str] = []
    for cand in (summary.get("base_model_uri"), summary.get("base_model_path"), art.config.get("model")):
        if not cand or cand in tried:
            continue
        tried.append(cand)
        try:
            ref = resolve_model(cand, store)
        except UsageError:
            continue
        if ref.kind == "hf" and (want is None or ref.digest == want):
            return ref
    raise NotFoundError(
        f"adapter {art.uri}: its base model is gone or changed (tried {', '.join(tried) or 'nothing'}; "
        f"none has the recorded digest {str(want)[:12]}…)",
        hint="restore the base model artifact (trace store ls model) or retrain the adapter",
    )


def _hub(ref: str) -> ModelRef:
    """A hub id works when it is already in the local Hugging Face cache; offline, anything else fails here."""
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(ref, local_files_only=True))
    except Exception as e:  # noqa: BLE001 - every failure mode means the same thing to the user
        raise NotFoundError(
            f"hub model {ref!r} is not in the local Hugging Face cache and this machine cannot download it "
            f"(offline): {type(e).__name__}",
            hint="download it elsewhere and pass the local directory, or build one with `trace model init`",
        ) from e
    check_hf_dir(path)
    return ModelRef("hf", ref, dir_digest(path), path=path)


def load_hf(ref: ModelRef, *, trainable_adapter: bool = False):
    """(model, tokenizer) for an hf or adapter reference, on the run's device in its dtype (`models.device`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_cli.models import device

    # an adapter artifact carries the tokenizer (and chat template) it was trained with
    tok_dir = ref.adapter_path if ref.adapter_path and has_tokenizer(ref.adapter_path) else ref.path
    tok = AutoTokenizer.from_pretrained(tok_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=device.dtype())
    if ref.kind == "adapter":
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, ref.adapter_path, is_trainable=trainable_adapter)
    model = device.place(model)
    model.eval()
    return model, tok

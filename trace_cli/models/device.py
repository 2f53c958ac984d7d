"""The one device choice: `$TRACE_DEVICE` (auto | cpu | cuda | cuda:N; default auto), read here only; with it
the size of the prefix cache that eval, calibration and GRPO rollouts share, `$TRACE_PREFIX_CACHE_MIB` (default
per device; 0: none, every episode prefills its whole prompt), read here only too.

auto takes the first CUDA GPU when one is visible, else the CPU. Asking for a GPU that is not there is a usage
error (exit 2), never a silent CPU fallback. Models load in bfloat16 on a GPU that supports it, else float32.
"""

from __future__ import annotations

import os
import re
from typing import Any

from trace_cli.errors import UsageError

ENV = "TRACE_DEVICE"
_FORM = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def requested() -> str:
    """What `$TRACE_DEVICE` asks for (auto when unset or empty), lower-cased and stripped."""
    return (os.environ.get(ENV) or "auto").strip().lower() or "auto"


def resolve(request: str | None = None) -> Any:
    """The `torch.device` for `request` (default: `requested()`); a GPU asked for but not visible exits 2."""
    req = requested() if request is None else request.strip().lower()
    if not _FORM.match(req):
        raise UsageError(f"{ENV}={req!r}: expected auto, cpu, cuda or cuda:N")
    import torch

    if req == "cpu" or (req == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if req == "auto":
        return torch.device("cuda", 0)
    if not torch.cuda.is_available():
        raise UsageError(
            f"{ENV}={req}: no CUDA GPU is visible here (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda or 'none'})",
            hint=f"unset {ENV} or set {ENV}=cpu to run on the CPU",
        )
    index = int(req.split(":")[1]) if ":" in req else 0
    if index >= torch.cuda.device_count():
        raise UsageError(f"{ENV}={req}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return torch.device("cuda", index)


def check() -> None:
    """Fail early (exit 2, before anything is written) when `$TRACE_DEVICE` cannot be honoured. The default
    (auto) and cpu need no torch import."""
    prefix_cache_mib("cpu")
    if requested() not in ("auto", "cpu"):
        resolve()


def is_cuda(device: Any = None) -> bool:
    """Whether the run's device (or `device`) is a CUDA GPU."""
    return (resolve() if device is None else device).type == "cuda"


def dtype(device: Any = None) -> Any:
    """bfloat16 on a CUDA GPU that supports it, else float32 (every CPU)."""
    import torch

    dev = resolve() if device is None else device
    if dev.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def place(model: Any, device: Any = None) -> Any:
    """`model` moved to the run's device (or `device`); the same object on the CPU."""
    dev = resolve() if device is None else device
    return model if dev.type == "cpu" else model.to(dev)


PREFIX_CACHE_MIB = {"cpu": 512, "cuda": 4096}  # keys/values kept for prompts that episodes share
PREFIX_CACHE_ENV = "TRACE_PREFIX_CACHE_MIB"


def prefix_cache_mib(kind: str) -> float:
    """The prefix cache's size in MiB for a device kind: `$TRACE_PREFIX_CACHE_MIB` when set (0: no cache), else
    the device's default; anything but a number >= 0 is a usage error (exit 2)."""
    raw = (os.environ.get(PREFIX_CACHE_ENV) or "").strip()
    if not raw:
        return PREFIX_CACHE_MIB.get(kind, 512)
    try:
        mib = float(raw)
    except ValueError:
        mib = -1.0
    if not 0 <= mib < float("inf"):
        raise UsageError(f"{PREFIX_CACHE_ENV}={raw!r}: expected a size in MiB >= 0 (0: no prefix cache)")
    return mib


def prefix_cache(model: Any, dev: Any = None) -> Any:
    """A `models.prefix_cache.PrefixCache` for `model`'s current weights, sized for the run's device: eval,
    calibration and GRPO rollouts prefill the system prompt and tool schemas their episodes share once. None
    for a model with sliding-window layers, whose keys/values cannot be reused by prefix (as serve does), and
    when `$TRACE_PREFIX_CACHE_MIB` is 0."""
    from trace_cli.models.prefix_cache import PrefixCache, has_sliding_layers

    if has_sliding_layers(model.config):
        return None
    mib = prefix_cache_mib((resolve() if dev is None else dev).type)
    return PrefixCache(int(mib * 2**20)) if mib > 0 else None

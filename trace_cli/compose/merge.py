"""Linear merge of the adapters (the paper's ablation baseline): PEFT `add_weighted_adapter`, saved as one
ordinary PEFT adapter, merged into the base weights when loaded."""

from __future__ import annotations

import shutil
from pathlib import Path

from trace_cli.errors import UsageError

MERGED_NAME = "merged"


def merge_adapters(
    base_dir: Path, adapters: list[tuple[str, Path]], weights: list[float], combination_type: str, out: Path
) -> None:
    """Load every adapter into one PeftModel on the base, add their weighted combination, save it to `out`."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    (first, first_dir), rest = adapters[0], adapters[1:]
    pm = PeftModel.from_pretrained(base, first_dir, adapter_name=first)
    for name, d in rest:
        pm.load_adapter(d, adapter_name=name)
    names = [n for n, _ in adapters]
    try:
        pm.add_weighted_adapter(names, list(weights), MERGED_NAME, combination_type=combination_type)
    except ValueError as e:  # e.g. linear needs equal ranks and targets
        raise UsageError(
            f"merge: PEFT cannot combine these adapters with combination_type {combination_type!r}: {e}",
            hint="adapters of different ranks or targets: --set merge.combination_type=cat",
        ) from e
    tmp = out.parent / f".{out.name}.tmp"
    pm.save_pretrained(tmp, selected_adapters=[MERGED_NAME])
    src = tmp / MERGED_NAME if (tmp / MERGED_NAME).is_dir() else tmp
    shutil.move(str(src), str(out))
    shutil.rmtree(tmp, ignore_errors=True)


def load_merged(model, merged_dir: Path):
    """The base model with the merged adapter folded into its weights (plain-model speed)."""
    from peft import PeftModel

    pm = PeftModel.from_pretrained(model, merged_dir)
    return pm.merge_and_unload()

"""Helpers and fixtures for the compose tests (tests/compose and tests/stages/test_compose.py): the shared tiny model, LoRA adapter artifacts written the way `trace train
--method grpo` writes them (PEFT files + manifest with capability, env and base), and two capability
environments (synthetic templates on the shop tools) registered under test names."""

from __future__ import annotations

from pathlib import Path

import pytest
import tinymodel  # noqa: E402

CAPS = {"structured_data_reasoning": "cx-sdr", "tool_calling_precision": "cx-tcp"}
TARGET = "shop?families=order_status,cancel_order"  # the target: families neither expert trains


def register_envs() -> None:
    from trace_cli.envs.registry import register
    from trace_cli.envs.shop import TOOL_SCHEMAS
    from trace_cli.envs.synthetic import get_template

    for cap, name in CAPS.items():
        register(name, lambda cap=cap, **kw: get_template(cap)(tools=TOOL_SCHEMAS, **kw), overwrite=True)


def make_adapter(
    store,
    base_dir: Path,
    capability: str,
    env: str,
    *,
    seed: int,
    scale: float = 0.2,
    r: int = 4,
    name=None,
    episodes=None,
):
    """A PEFT LoRA adapter with non-zero random A and B, committed as an `adapter` artifact like GRPO's (with
    `episodes`, rollouts-format rows, as the training episodes GRPO keeps)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trace_cli.models.refs import resolve_model

    base = resolve_model(str(base_dir), store)  # a dir, or store://model/NAME (its digest is the artifact's)
    base_dir = base.path
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    pm = get_peft_model(
        model, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    ref = str(base_dir if base.artifact_id is None else base.display)
    cfg = {"method": "grpo", "env": env, "model": ref, "capability": capability, "seed": seed}
    with store.writer(
        "adapter", "train", cfg, [base.as_input("model")], name=name or capability.split("_")[0]
    ) as w:
        pm.save_pretrained(w.path / "adapter")
        if episodes is not None:
            from trace_cli.store.rollouts import write_tables

            write_tables(w.path, episodes, [])
        w.summary.update(
            method="grpo",
            capability=capability,
            env=env,
            base_model=ref,
            base_model_uri=f"store://model/{base.artifact_id}" if base.artifact_id else None,
            base_model_path=str(Path(base_dir).resolve()),
        )
    return w.artifact


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    return tinymodel.tiny(tmp_path_factory)


@pytest.fixture(scope="session")
def composed_store(tiny, tmp_path_factory):
    """A store with two expert adapters on the tiny model (and the test environments registered)."""
    from trace_cli.store import Store

    register_envs()
    st = Store(tmp_path_factory.mktemp("compose") / "store")
    for i, (cap, env) in enumerate(CAPS.items()):
        make_adapter(st, tiny.hf, cap, env, seed=i + 1)
    return st

"""Helpers shared by the GRPO tests: a tiny offline model (built once per session) and a `parity` test
environment whose reward varies with what the agent says, so GRPO groups carry signal even for a random model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trace_cli.envs.base import Observation, RewardBreakdown, StepResult

TEST_ENV = "grpo-parity"
CAPABILITY = "parity_talk"
ENV_VARS = {
    "HF_HUB_OFFLINE": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "TRACE_NO_PROGRESS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
_MODEL: dict[str, Path] = {}


def set_env() -> None:
    for k, v in ENV_VARS.items():
        os.environ[k] = v


def tiny_model(tmp_path_factory) -> Path:
    """The `hf` dir of a tiny Qwen3 model artifact (built offline once per test session)."""
    if "dir" not in _MODEL:
        set_env()
        from trace_cli.stages.base import execute
        from trace_cli.store import Store

        root = tmp_path_factory.mktemp("grpo-model") / "store"
        art = execute("model", {"preset": "tiny", "corpus_seeds": 20}, Store(root)).main
        _MODEL["dir"] = art.path / "hf"
        _MODEL["store"] = root
        _MODEL["uri"] = art.uri
    return _MODEL["dir"]


def model_store() -> Path:
    return _MODEL["store"]


class ParityEnv:
    """One user turn: reward 1 if the agent's first message has an even number of characters, else 0.
    Two tool-free turns at most; the capability is reported in the task metadata."""

    name = TEST_ENV

    def __init__(self, max_turns: int = 2):
        self.max_turns = max_turns
        self.seed = None
        self.said: list[str] = []
        self.turns = 0

    def reset(self, seed: int) -> Observation:
        self.seed, self.said, self.turns = seed, [], 0
        return Observation(
            system_prompt="You are a test agent. Answer the user.",
            tools=[],
            messages=[{"role": "user", "content": f"Say something about the number {seed}."}],
            task_id=f"parity-{seed}",
        )

    def step(self, action: dict[str, Any]) -> StepResult:
        self.turns += 1
        if "content" in action:
            self.said.append(action["content"])
        done = self.turns >= self.max_turns
        return StepResult(
            "Tell me more.",
            role="user",
            done=done,
            reward=self.verify().reward,
            info={"termination": "max_turns" if done else ""},
        )

    def verify(self) -> RewardBreakdown:
        r = float(bool(self.said) and len(self.said[0]) % 2 == 0)
        return RewardBreakdown(reward=r, success=r == 1.0)

    def task_metadata(self) -> dict[str, Any]:
        return {
            "task_id": f"parity-{self.seed}",
            "family": "parity",
            "capability": CAPABILITY,
            "required_capabilities": [CAPABILITY],
        }

    def reference_actions(self) -> list[dict[str, Any]]:
        return [{"content": "ok"}]


def register_parity() -> None:
    from trace_cli.envs.registry import register

    register(TEST_ENV, lambda **kw: ParityEnv(**kw), overwrite=True)


def grpo_config(model: Path | str, env: str = TEST_ENV, **over: Any) -> dict[str, Any]:
    """A GRPO config small enough for two shared CPU cores."""
    cfg: dict[str, Any] = {
        "method": "grpo",
        "env": env,
        "model": str(model),
        "seeds": "100:140",
        "num_generations": 4,
        "per_device_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "max_steps": 2,
        "max_turns": 2,
        "max_new_tokens": 12,
        "max_completion_length": 96,
        "checkpoint_every": 0,
        "learning_rate": 0.05,
        "lora": {"r": 4, "alpha": 8},
    }
    cfg.update(over)
    return cfg


def grpo_spec(model_dir: Path, output_dir: Path, seeds: list[int], keep_model: bool = False, **settings: Any):
    """A `GRPOSpec` for `train_grpo` on the parity env: `settings` are grpo config keys, over the schema's
    defaults (the config is checked and filled as the stage does)."""
    from trace_cli.envs.registry import make_env
    from trace_cli.stages.train import _method_config
    from trace_cli.training.grpo import GRPOSpec
    from trace_cli.training.grpo_spec import episodes_per_step

    cfg = _method_config({"method": "grpo", "env": TEST_ENV, "model": str(model_dir), **settings})
    return GRPOSpec.from_config(
        cfg,
        episodes_per_step=episodes_per_step(cfg, 1),
        model_path=str(model_dir),
        make_env=lambda: make_env(TEST_ENV),
        seeds=seeds,
        output_dir=str(output_dir),
        keep_model=keep_model,
    )

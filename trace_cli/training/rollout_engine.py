"""The rollout engine of one GRPO run (agents.engines): what its rollouts and its validation episodes are generated
on, and, with a server, keeping the server on-policy.

* `hf`: the trainer's own model in this process (the policies' built-in path): nothing to sync.
* `vllm`: TRL's colocated engine. TRL pushes the weights before each rollout call; validation (greedy, between
  two of TRL's syncs) pushes them itself (`VLLMColocated(direct=True)`).
* `server`: before the first rollouts after each optimizer step, the main process saves the adapter
  (`output_dir/served/step-N`, N = optimizer steps so far) and loads it into the server as LoRA
  `<run>-step-N` (vLLM's `/v1/load_lora_adapter`), unloading the previous version; every rank then samples with
  that name. The name is each episode's `adapter_version` (kept episodes' `info`), and the loads are the
  adapter summary's `rollout.adapter_loads`. Validation at step N loads the same version (rank 0 only), so the
  step's rollouts find it loaded.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_cli.agents.engines import RolloutSettings, VLLMColocated

SERVED_DIR = "served"


class RunEngine:
    def __init__(self, spec: Any):
        self.settings = RolloutSettings.of(spec.rollout)
        self.kind = self.settings.engine
        self.output_dir = Path(spec.output_dir)
        self.server = self.settings.server() if self.kind == "server" else None
        if self.server is not None:
            self.server.check()
        self.prefix = self.output_dir.parent.name or "trace-grpo"  # train-<artifact id>: one run's versions
        self.served_step: int | None = None
        self.loads: list[dict[str, Any]] = []

    def version(self, step: int) -> str | None:
        """The adapter version rollouts after `step` optimizer steps are sampled with (None: this process)."""
        return f"{self.prefix}-step-{step}" if self.server is not None else None

    def for_rollouts(self, trainer: Any, model: Any, step: int, *, main: bool, barrier: Callable[[], None]):
        """The engine of this rollout call (None: the model in this process). Every rank calls it at once."""
        if self.kind == "vllm":
            return VLLMColocated(trainer.vllm_generation)
        if self.server is None:
            return None
        if main:
            self._load(model, step)
        barrier()  # the other ranks sample only once the version is loaded
        self.server.use(self.version(step))
        self.served_step = step
        return self.server

    def for_validation(self, trainer: Any, model: Any, step: int):
        """The engine validation at `step` runs on (main process only)."""
        if self.kind == "vllm":
            return VLLMColocated(trainer.vllm_generation, direct=True)
        if self.server is None:
            return None
        self._load(model, step)
        self.server.use(self.version(step))
        return self.server

    def _load(self, model: Any, step: int) -> None:
        if self.served_step == step and self.server.active == self.version(step):
            return
        from trace_cli.training.validation import save_adapter

        t0 = time.monotonic()
        path = self.output_dir / SERVED_DIR / f"step-{step}"
        save_adapter(model, path)
        self.server.swap_adapter(self.version(step), str(path))
        for old in (self.output_dir / SERVED_DIR).glob("step-*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        self.served_step = step
        self.loads.append({"step": step, "version": self.version(step), "s": round(time.monotonic() - t0, 3)})

    def close(self) -> None:
        """Unload this run's adapters from the server (it keeps serving the base and anything else)."""
        if self.server is not None:
            self.server.close()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.kind}
        if self.server is not None:
            out.update(url=self.server.url, model=self.server.model, adapter_loads=list(self.loads))
        return out

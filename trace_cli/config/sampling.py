"""How a policy samples its episodes: one `SamplingSettings` for calibration (synthesize), the calibration
episodes train replays, GRPO's own rollouts (train) and eval.

The schemas own every default, range and help text (train.v1.json and eval.v1.json at the top level,
synthesize.v1.json in its `calibration` block with `max_turns` at the top level); this class declares none of
its own, holds the cross-field check once, and `tests/config/test_defaults.py` checks its fields against those
schemas. `reuse_key` is the contract between synthesize, which records how the calibration episodes it keeps
were sampled, and train, which replays them only when it would sample the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from trace_cli.errors import UsageError

# the stages' schema blocks that hold the sampling keys (synthesize: `calibration`; max_turns is top-level)
SCHEMA_BLOCKS = {"train": (), "eval": (), "synthesize": ("calibration",)}


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float
    top_p: float
    max_new_tokens: int  # per model turn
    max_completion_length: (
        int | None
    )  # the whole episode's generated + environment tokens; None: no budget (eval)
    max_turns: int  # model turns per episode

    def __post_init__(self) -> None:
        if self.max_completion_length is not None and self.max_new_tokens > self.max_completion_length:
            raise UsageError(
                f"max_new_tokens ({self.max_new_tokens}) exceeds max_completion_length "
                f"({self.max_completion_length}), the budget of the whole episode"
            )

    @classmethod
    def of(cls, block: Mapping[str, Any], *, max_turns: int | None = None) -> SamplingSettings:
        """The settings of a validated config block (its schema defaults filled); `max_turns` where the block
        does not hold it (synthesize's `calibration`)."""
        return cls(
            temperature=block["temperature"],
            top_p=block["top_p"],
            max_new_tokens=block["max_new_tokens"],
            max_completion_length=block.get("max_completion_length"),
            max_turns=block["max_turns"] if max_turns is None else max_turns,
        )

    def policy_kwargs(self) -> dict[str, Any]:
        """What a policy loader takes of them (`compose.policy.load_policy`)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_new_tokens": self.max_new_tokens}

    def reuse_key(self, model_digest: str) -> dict[str, Any]:
        """What must be equal for episodes sampled under one setting to stand for another's: the model and
        every sampling setting. Synthesize records it with the calibration rollouts it keeps; train compares."""
        return {"model_digest": model_digest, **asdict(self)}


REUSE_KEYS = ("model_digest", *(f.name for f in fields(SamplingSettings)))

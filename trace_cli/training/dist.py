"""Which process of a training run this is: ranks as the launcher (`accelerate launch`, torchrun) set them, and
the process group a GRPO run joins.

Ranks are read from the environment first (cheap: no torch.distributed needed), so the CLI can decide who
prints and names artifacts before anything heavy is imported.
"""

from __future__ import annotations

import os


def world_size() -> int:
    """Processes of this run as the launcher set them (1 when not launched by accelerate/torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def process_rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def is_main_process() -> bool:
    """Rank 0, read from the launcher's environment."""
    return process_rank() == 0


def process_group():
    """The run's `accelerate.PartialState`: joins the process group when launched by accelerate/torchrun.

    cpu=True when no GPU is visible, as the Trainer will decide (use_cpu); else a GPU-less multi-process launch
    would be seen as N independent single processes."""
    from accelerate import PartialState

    from trace_cli.models import device

    return PartialState(cpu=not device.is_cuda())

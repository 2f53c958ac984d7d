"""Checkpoints of a GRPO run: its resumable work dir (the Trainer's `checkpoint-N/` dirs, a lock, the RESUMABLE
marker) and the adapter files kept from it.

The work dir is deterministic (`STORE/.tmp/train-<id>/`), so `--resume` finds an interrupted run, and the same on
every rank. Only rank 0 touches it: takes the lock (a second `trace train` of the same job is refused), drops an
interrupted run's checkpoints unless resuming, writes the marker that `trace store gc` keeps, and removes the
whole dir once the run has its artifact or failed its checks. A run that dies keeps it, for `--resume`.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_cli.errors import UsageError
from trace_cli.store.artifacts import RESUMABLE

CHECKPOINT_PREFIX = "checkpoint-"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
WORK_PREFIX = "train-"


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest complete checkpoint (the Trainer writes trainer_state.json last)."""
    d = Path(directory)
    if not d.is_dir():
        return None
    done = [
        p
        for p in d.iterdir()
        if p.is_dir()
        and p.name.startswith(CHECKPOINT_PREFIX)
        and p.name[len(CHECKPOINT_PREFIX) :].isdigit()
        and (p / "trainer_state.json").is_file()
    ]
    return max(done, key=checkpoint_step, default=None)


def checkpoint_step(path: str | Path) -> int:
    return int(Path(path).name[len(CHECKPOINT_PREFIX) :])


def copy_adapter(src: Path, dst: Path) -> None:
    """The PEFT adapter files only (no tokenizer copies, no pickled training args)."""
    dst.mkdir(parents=True, exist_ok=True)
    missing = [f for f in ADAPTER_FILES if not (src / f).is_file()]
    if missing:
        raise RuntimeError(f"{src}: trainer did not save {', '.join(missing)}")
    for f in ADAPTER_FILES:
        shutil.copy2(src / f, dst / f)


def lock(path: Path):
    """An exclusive advisory lock held for the run (released by the OS if the process dies)."""
    import fcntl

    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise UsageError(
            f"another `trace train` is running this exact job (lock {path} is held); wait for it or kill it"
        ) from None
    return fh


class WorkDir:
    """The work dir of one GRPO run, as one rank sees it (`main`: rank 0, the only one that changes it)."""

    def __init__(self, tmp_root: Path, run_id: str, *, main: bool):
        self.path = Path(tmp_root) / f"{WORK_PREFIX}{run_id}"
        self.checkpoints = self.path / "checkpoints"
        self.main = main
        self._lock = None

    def claim(self, *, resume: bool, marker: dict[str, Any], barrier: Callable[[], None]) -> Path | None:
        """Rank 0 locks the dir, discards an interrupted run's checkpoints unless `resume`, writes the marker;
        after the `barrier` every rank gets the checkpoint to resume from (None: start at step 0)."""
        if self.main:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = lock(self.path / ".lock")
            found = latest_checkpoint(self.checkpoints)
            if found is not None and not resume:
                print(
                    f"train: discarding the checkpoint of an interrupted run ({found.name}); pass --resume to "
                    "continue from it",
                    file=sys.stderr,
                )
                shutil.rmtree(self.checkpoints, ignore_errors=True)
            elif found is None and resume:
                print(
                    "train: --resume: no checkpoint of this run found; starting from step 0", file=sys.stderr
                )
            (self.path / RESUMABLE).write_text(json.dumps(marker) + "\n")
        barrier()
        found = latest_checkpoint(self.checkpoints) if resume else None
        if self.main and found is not None:
            print(f"train: resuming from {found.name}", file=sys.stderr)
        return found

    def remove(self) -> None:
        """Rank 0: delete the dir and release the lock (the run is stored, or failed its checks)."""
        if not self.main:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

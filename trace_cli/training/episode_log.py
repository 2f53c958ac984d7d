"""A GRPO run keeps its own episodes: the rollouts it trained on, already paid for, become the adapter's
`episodes.parquet` + `tool_calls.parquet` (the rollouts format, `store.rollouts`), which the MoE gates learn from.

Each rollout call writes its episodes at once as one part (`<output_dir>/episodes/part-<step>-<rank>-<call>/`,
renamed into place when complete), so a crash loses none that were trained on; a resumed run drops the parts of
steps after its checkpoint (it generates them again). When the adapter is stored, the parts are joined.

Per episode: the messages (a hinted episode's system prompt without its `<expert_guidance>` block: what the
gradient step saw), tools, reward, success, seed (= the GRPO group: `trial` is the place in it), and in `info`
the optimizer `step`, `group_mean` (the group's mean reward in that call) and `advantage` = reward - group_mean
(before any std scaling), `hinted`. Pre-generated (replayed calibration) episodes are not kept: they are the
base's, not this run's.

Size: at most `episodes_kept` episodes, spread over the steps: each step keeps its first whole groups up to
episodes_kept / max_steps (at least one group). Measured: the demo's precondition adapter keeps its 768 episodes
in 92 KB (episodes 66 KB + tool calls 26 KB, zstd), so the default 4096 stays within a few MB even for episodes
several times longer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

EPISODES_DIR = "episodes"


def part_step(path: Path) -> int:
    return int(path.name.split("-")[1])


class EpisodeLog:
    """Writes the episodes of each rollout call (rank `rank`) under `directory`, within the size bound."""

    def __init__(self, directory: str | Path, *, kept: int, max_steps: int, group: int, rank: int = 0):
        self.dir = Path(directory)
        self.per_step = max(group, (kept // max(1, max_steps)) // group * group) if kept else 0
        self.kept = kept
        self.rank = rank
        self.calls = 0
        self.used: dict[int, int] = {}

    def drop_after(self, step: int) -> None:
        """A resumed run: parts of steps after its checkpoint's are generated again."""
        if self.dir.is_dir():
            for p in self.dir.glob("part-*"):
                if part_step(p) > step:
                    shutil.rmtree(p, ignore_errors=True)

    def write(
        self, step: int, results: list[Any], hints: Any, source: str, version: str | None = None
    ) -> int:
        """Keep this call's first whole groups within the step's quota; returns how many episodes were kept.
        `hints`: how many of each group saw the hint (a number, or a function of the seed). `version`: the
        adapter version the rollout engine sampled them with (a server's LoRA name), kept in each episode's
        info as `adapter_version`."""
        from trace_cli.store.rollouts import result_row, write_tables

        room = max(0, self.per_step - self.used.get(step, 0))
        group = len(results) // max(1, len({r.seed for r in results}))
        take = min(len(results), room // max(1, group) * group)
        if take <= 0:
            return 0
        self.calls += 1
        episodes, calls = [], []
        rank: dict[int, int] = {}
        for r in results[:take]:
            mean = sum(x.reward for x in results if x.seed == r.seed) / sum(
                1 for x in results if x.seed == r.seed
            )
            place = rank[r.seed] = rank.get(r.seed, -1) + 1
            hinted = place < (hints(r.seed) if callable(hints) else hints)
            info = {
                "step": step,
                "group_mean": mean,
                "advantage": float(r.reward) - mean,
                "hinted": hinted,
            }
            if version is not None:
                info["adapter_version"] = version
            messages = _unhinted(r.messages) if hinted else r.messages
            eid = f"s{step}-r{self.rank}-c{self.calls}-{r.task_id}-t{place}"
            ep, rows = result_row(r, eid, source, info, messages=messages, trial=place)
            episodes.append(ep)
            calls.extend(rows)
        part = self.dir / f"part-{step:06d}-{self.rank}-{self.calls}"
        tmp = part.with_name(part.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        write_tables(tmp, episodes, calls)
        tmp.replace(part)
        self.used[step] = self.used.get(step, 0) + take
        return take


def _unhinted(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from trace_cli.envs.synthetic.hints import strip_guidance

    return [dict(m, content=strip_guidance(m["content"])) if m["role"] == "system" else m for m in messages]


def collect(directory: str | Path, dest: Path, *, max_step: int | None = None) -> int:
    """Join the parts (of steps <= max_step) into dest/episodes.parquet + tool_calls.parquet; returns the
    number of episodes (0: nothing written)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trace_cli.store import layout
    from trace_cli.store.rollouts import write_tables

    d = Path(directory)
    parts = sorted(
        p
        for p in (d.glob("part-*") if d.is_dir() else [])
        if not p.name.endswith(".tmp") and (max_step is None or part_step(p) <= max_step)
    )
    if not parts:
        return 0
    ep = pa.concat_tables([pq.read_table(p / layout.EPISODES) for p in parts])
    tc = pa.concat_tables([pq.read_table(p / layout.TOOL_CALLS) for p in parts])
    write_tables(dest, ep, tc)
    return ep.num_rows


def episode_info(ep: dict[str, Any]) -> dict[str, Any]:
    """The `info` of a kept episode, decoded."""
    info = ep.get("info")
    return json.loads(info) if isinstance(info, str) else (info or {})

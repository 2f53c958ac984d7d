"""`training.episode_log`: a GRPO run's episodes are written per rollout call (whole groups, within the size
bound), a resumed run drops the parts after its checkpoint, and the parts join into the rollouts format."""

from __future__ import annotations

from types import SimpleNamespace

from trace_cli.store.rollouts import read_episodes
from trace_cli.training.episode_log import EpisodeLog, collect


def _results(seeds: list[int], group: int, hinted_system: str = "sys") -> list[SimpleNamespace]:
    out = []
    for s in seeds:
        for k in range(group):
            out.append(
                SimpleNamespace(
                    env="shop",
                    seed=s,
                    trial=len(out),
                    task_id=f"task-{s}",
                    reward=float(k % 2),
                    success=bool(k % 2),
                    termination="done",
                    n_actions=1,
                    tools=[],
                    metadata={"family": "f"},
                    messages=[
                        {"role": "system", "content": hinted_system},
                        {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "ok"},
                    ],
                )
            )
    return out


def test_bound_whole_groups_and_join(tmp_path):
    log = EpisodeLog(tmp_path / "eps", kept=12, max_steps=2, group=4)  # 6 per step -> 1 whole group of 4
    assert log.write(1, _results([7, 8], 4), 0, "grpo") == 4
    assert log.write(1, _results([9], 4), 0, "grpo") == 0  # the step's quota is used
    assert log.write(2, _results([10, 11], 4), 0, "grpo") == 4
    assert collect(tmp_path / "eps", tmp_path, max_step=1) == 4
    assert collect(tmp_path / "eps", tmp_path) == 8
    eps = read_episodes(tmp_path)
    assert [ep["seed"] for ep in eps] == [7] * 4 + [10] * 4
    assert [ep["info"]["advantage"] for ep in eps[:4]] == [-0.5, 0.5, -0.5, 0.5]
    assert {ep["info"]["group_mean"] for ep in eps} == {0.5}


def test_hinted_episodes_keep_the_prompt_without_the_hint(tmp_path):
    from trace_cli.envs.synthetic.hints import strip_guidance

    system = "sys\n<expert_guidance>do X</expert_guidance>"
    assert strip_guidance(system) != system  # the fixture really carries a hint
    log = EpisodeLog(tmp_path / "eps", kept=100, max_steps=1, group=2)
    log.write(1, _results([3], 2, hinted_system=system), 1, "grpo")
    collect(tmp_path / "eps", tmp_path)
    eps = read_episodes(tmp_path)
    assert [ep["info"]["hinted"] for ep in eps] == [True, False]
    assert eps[0]["messages"][0]["content"] == strip_guidance(system)
    assert eps[1]["messages"][0]["content"] == system


def test_resume_drops_the_parts_after_the_checkpoint(tmp_path):
    log = EpisodeLog(tmp_path / "eps", kept=100, max_steps=3, group=2)
    for step in (1, 2, 3):
        log.write(step, _results([step], 2), 0, "grpo")
    EpisodeLog(tmp_path / "eps", kept=100, max_steps=3, group=2).drop_after(2)
    assert collect(tmp_path / "eps", tmp_path) == 4
    assert sorted({ep["info"]["step"] for ep in read_episodes(tmp_path)}) == [1, 2]

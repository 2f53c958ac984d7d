"""The mechanism test's two bases (issue 44): recipes/mechanism-base-agent.yaml withholds exactly shop-ladder's planted
skills, each 70 % of the time on its own coin; recipes/mechanism-capacity-control.yaml is the same recipe with nothing withheld; both
validate, and (slow) run their first steps at a tiny size on a fresh store."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from trace_testing import REPO, run_cli

from trace_cli.envs.ladder import PLANTED
from trace_cli.store import Store

BASE, CONTROL = (REPO / "recipes" / f"mechanism-{n}.yaml" for n in ("base-agent", "capacity-control"))
TINY = [
    "--set",
    "steps.pretrain.with.max_steps=10",
    "--set",
    "steps.pretrain.with.require_target=false",
    "--set",
    "steps.pretrain.with.probe_every=10",
    "--set",
    "steps.pretrain.with.probe_size=10",
    "--set",
    "steps.sft.with.seeds=100000:100016",
    "--set",
    "steps.sft.with.max_minutes=0.2",
]


def _steps(path: Path) -> dict[str, dict]:
    return {s["id"]: s for s in yaml.safe_load(path.read_text())["steps"]}


def test_the_planted_base_withholds_the_ladders_skills_and_the_control_nothing_else_differs():
    base, control = _steps(BASE), _steps(CONTROL)
    sft = base["sft"]["with"]
    # every demonstration asks, and each planted skill is withheld on its own coin with probability 0.7
    assert sft["env"] == "shop-ladder?mix=base&withhold=0.7" and sft["deficit_rate"] == 1.0
    assert sorted(sft["deficits"]) == sorted(PLANTED)
    assert control["sft"]["with"]["deficits"] == []
    # the same model, pretraining and SFT settings: only the withheld skills (and the artifact's name) differ
    assert base["model"] == control["model"] and base["pretrain"] == control["pretrain"]
    strip = {"deficits"}
    assert {k: v for k, v in sft.items() if k not in strip} == {
        k: v for k, v in control["sft"]["with"].items() if k not in strip
    }
    assert base["sft"]["name"] != control["sft"]["name"]
    r = run_cli("validate", str(BASE), str(CONTROL))
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_both_bases_run_their_first_steps_at_a_tiny_size(tmp_path):
    """The real recipes with tiny pretraining and SFT sizes (--set): the control reuses the base's model and
    pretraining artifacts (same configs, same ids) and trains its own SFT model."""
    store = tmp_path / "store"
    for recipe in (BASE, CONTROL):
        r = run_cli("run", str(recipe), "--store", str(store), *TINY)
        assert r.exit_code == 0, r.output[-3000:]
    models = Store(store).list("model")
    assert sorted(a.manifest.get("stage") for a in models) == ["model", "pretrain", "train", "train"]
    withheld = sorted(
        tuple(a.manifest["config"]["deficits"]) for a in models if a.manifest["stage"] == "train"
    )
    assert withheld == [(), tuple(_steps(BASE)["sft"]["with"]["deficits"])]

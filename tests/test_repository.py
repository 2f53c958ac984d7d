"""Repository hygiene: the project reads only its own files (the τ²-bench samples are vendored in examples/)."""

from __future__ import annotations

import subprocess

from trace_testing import REPO, TAU2_DIR, TAU2_FILES


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_tracked_file_reads_the_shared_folder():
    offenders = []
    needle = "../" + "shared"  # split so this file does not match itself
    for rel in tracked_files():
        path = REPO / rel
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if needle in text:
            offenders.append(rel)
    assert offenders == []


def test_no_tracked_file_cites_a_design_document_outside_the_repository():
    """The design is ARCHITECTURE.md, in the repository; no file cites notes a clone does not have."""
    needle = "DESIGN" + ".md"  # split so this file does not match itself
    offenders = []
    for rel in tracked_files():
        path = REPO / rel
        try:
            text = path.read_text(encoding="utf-8") if path.is_file() else ""
        except UnicodeDecodeError:
            continue
        if needle in text or "DESIGN" + " §" in text or "DESIGN" + " notes" in text:
            offenders.append(rel)
    assert offenders == []
    assert (REPO / "ARCHITECTURE.md").is_file()


def test_vendored_tau2_data_has_licence_and_readme():
    for f in [*TAU2_FILES.values(), "LICENSE", "README.md"]:
        assert (TAU2_DIR / f).is_file(), f
    assert "MIT" in (TAU2_DIR / "LICENSE").read_text()
    tracked = set(tracked_files())
    assert all(f"examples/tau2/{f}" in tracked for f in TAU2_FILES.values())


def test_the_demo_base_agent_is_committed_small_and_documented():
    """recipes/demo.yaml imports examples/demo-base-agent; recipes/base-agent.yaml says how it was built and
    names the weights' sha256 prefix, which must match the committed file."""
    import hashlib
    from pathlib import Path

    d = REPO / "examples" / "demo-base-agent"
    tracked = subprocess.run(
        ["git", "ls-files", str(d)], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    names = {Path(p).name for p in tracked}
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= names
    weights = d / "model.safetensors"
    assert weights.stat().st_size <= 20 * 2**20
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    recipe = (REPO / "recipes" / "base-agent.yaml").read_text()
    assert f"sha256 {digest[:8]}" in recipe
    assert "source: ../examples/demo-base-agent" in (REPO / "recipes" / "demo.yaml").read_text()


def test_the_demo_calibrates_on_the_base_agent_and_evaluates_compositions_on_seeds_nobody_diagnosed():
    """No scripted twin calibrates a demo environment, and the compositions are measured (against the base) on shop
    seeds disjoint from the ones whose rollouts were diagnosed."""
    import yaml

    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    steps = {s["id"]: s for s in doc["steps"]}
    synth = [s for s in doc["steps"] if s["uses"] == "synthesize"]
    assert synth and all(s["with"]["model"] == "${steps.base.outputs.model}" for s in synth)

    def seeds(step_id: str) -> range:
        a, b = (int(x) for x in steps[step_id]["with"]["seeds"].split(":"))
        return range(a, b)

    diagnosed = steps[steps["diagnose"]["with"]["rollouts"].split(".")[1]]["id"]
    comp_evals = [
        s["id"] for s in doc["steps"] if s["uses"] == "eval" and "composition" in str(s["with"]["model"])
    ]
    assert len(comp_evals) == 3
    for sid in [*comp_evals, "base_eval_heldout"]:
        assert steps[sid]["with"]["env"] == "shop"
        assert not set(seeds(sid)) & set(seeds(diagnosed)), sid
        assert seeds(sid) == seeds("base_eval_heldout")  # compared on the same seeds
    assert steps["moe"]["with"]["moe"]["diagnosis"] == "${steps.diagnose.outputs.diagnosis}"

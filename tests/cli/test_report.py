"""`trace report`: a self-contained HTML page with plots, built from a real store (scripted policies, real
stages), checked for its figures and data, and rendered in headless Chromium when it is installed."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trace_testing import run_cli, snapshot

from trace_cli.stages.base import execute
from trace_cli.store import Store

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = "policy:demonstration?deficits=precondition_verification,multi_step_completion&rate=1"


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("report") / "store")
    execute("eval", {"model": SCRIPTED, "env": "shop", "seeds": "0:60"}, st, name="scripted-eval")
    execute("eval", {"model": "policy:reference", "env": "shop", "seeds": "0:60"}, st, name="reference-eval")
    execute("diagnose", {"rollouts": "store://rollouts/scripted-eval", "analyst": "rules"}, st, name="diag")
    execute(
        "synthesize",
        {
            "diagnosis": "store://diagnosis/diag",
            "capability": "precondition_verification",
            "model": "policy:demonstration?rate=0.5",
            "calibration": {"seeds": 12, "rollouts": 4},
        },
        st,
        name="env-pre",
    )
    return st


def _pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_report_embeds_a_figure_per_section_and_the_data(demo_store, tmp_path):
    out = tmp_path / "report.html"
    r = run_cli("report", "--out", str(out), "--json", "--store", str(demo_store.root))
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    page = out.read_text()
    pngs = _pngs(page)
    assert res["figures"] == len(pngs) >= 3
    from PIL import Image

    for png in pngs:  # real, decodable images with something drawn on them
        im = Image.open(io.BytesIO(png)).convert("L")
        assert im.size[0] > 300 and im.size[1] > 150
        lo, hi = im.getextrema()
        assert hi - lo > 100
    data = json.loads(re.search(r'id="trace-report-data">(.*?)</script>', page, re.S).group(1))
    [diag] = data["diagnoses"]
    sel = {c["name"] for c in diag["capabilities"] if c["selected"]}
    assert sel == {"precondition_verification", "multi_step_completion"}
    [env] = data["calibrations"]
    assert env["capability"] == "precondition_verification" and env["attempts"]
    assert env["band"] == [0.2, 0.6]
    [shop] = data["evals"]
    by_name = {r["name"]: r for r in shop["runs"]}
    assert by_name["reference-eval"]["pass@1"] == 1.0
    assert by_name["scripted-eval"]["families"]["multi_op"] == 0.0
    assert "multi_step_completion" in page and "Calibration" in page


def test_report_for_a_recipe_shows_only_its_artifacts(demo_store, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "kind: recipe\nversion: 1\nname: r\nsteps:\n"
        "  - {id: e, uses: eval, name: reference-eval, with: {model: 'policy:reference', env: shop, seeds: '0:60'}}\n"
    )
    out = tmp_path / "r.html"
    r = run_cli(
        "report", "--out", str(out), "--recipe", str(recipe), "--json", "--store", str(demo_store.root)
    )
    assert r.exit_code == 0, r.output
    page = out.read_text()
    data = json.loads(re.search(r'id="trace-report-data">(.*?)</script>', page, re.S).group(1))
    assert data["diagnoses"] == [] and data["calibrations"] == []
    assert [r["name"] for r in data["evals"][0]["runs"]] == ["reference-eval"]


def _se_data(page: str) -> dict:
    return json.loads(re.search(r'id="trace-report-data">(.*?)</script>', page, re.S).group(1))[
        "sample_efficiency"
    ]


def _benchmark():
    """benchmarks/se: the sample-efficiency benchmark's own results code (its writer, --combine, schemas)."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from se import results, stats

    return results, stats


def test_report_renders_the_committed_sample_efficiency_result(demo_store, tmp_path):
    """The result the README quotes, as the benchmark wrote it (it conforms to the benchmark's schema)."""
    results, _ = _benchmark()
    committed = REPO / "benchmarks" / "results" / "sample_efficiency_mixed.json"
    doc = results.read(committed)
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    assert run_cli("report", "--out", str(a), "--store", str(demo_store.root)).exit_code == 0
    r = run_cli(
        "report", "--out", str(b), "--sample-efficiency", str(committed), "--store", str(demo_store.root)
    )
    assert r.exit_code == 0, r.output
    page = b.read_text()
    assert len(_pngs(page)) == len(_pngs(a.read_text())) + 1 and "Sample efficiency" in page
    [panel] = _se_data(page)["targets"]
    rows = sorted(doc["targets"]["shop-mixed"]["budgets"], key=lambda r: r["rollouts"])
    assert panel["target"] == "shop-mixed" and panel["rollouts"] == [r["rollouts"] for r in rows]
    for m in ("grpo_target", "trace", "merge"):
        assert panel["methods"][m]["mean"] == [r[m]["mean"] for r in rows]
    assert panel["gain_ratio"] == [r["gain_ratio"] for r in rows]
    last = rows[-1]
    assert f"{last['gain_ratio']:.2f}×" in page  # the table beside the plot
    # the registered run keeps per-task outcomes: its paired bootstrap and the registered decision are shown
    lower = doc["targets"]["shop-mixed"]["bootstrap"][str(last["rollouts"])]["difference"]["lower_90"]
    assert f"90 % lower bound {lower:+.3f}" in page
    v = doc["verdict"]
    assert v["complete"] and f"gain ratio {v['gain_ratio']:.2f}×, 90 % lower bound {lower:+.3f}" in page
    assert ("): holds:" if v["holds"] else "): does not hold:") in page


def test_report_renders_a_combined_result_with_its_bootstrap(demo_store, tmp_path):
    """Per-seed files written by the benchmark's writer (with per-task outcomes), combined by the benchmark's
    --combine: the page shows each target's plot, the table and the paired bootstrap the benchmark computed."""
    results, stats = _benchmark()
    paths = []
    for seed, trace in ((0, 0.6), (1, 0.4)):
        tasks = {
            f"tasks_{m}": {f"t-{i}": v for i in range(20)}
            for m, v in (("base", 0.0), ("grpo_target", 0.2), ("trace", trace))
        }
        runs = [
            {
                "target": t,
                "budget": 640,
                "seed": seed,
                "base": 0.0,
                "grpo_target": 0.2,
                "trace": trace,
                **tasks,
            }
            for t in ("shop", "shop-mixed")
        ]
        doc = {
            "benchmark": "sample_efficiency",
            "commit": f"c{seed}",
            "dirty": False,
            "command": "python benchmarks/sample_efficiency.py",
            "held_out": "500000:500020",
            "train_seeds": [seed],
            "settings": {"budgets": [640], "episodes_per_step": 32, "learning_rate": 0.002},
            "targets": stats.summarize(runs),
            "runs": runs,
        }
        paths.append(results.write(tmp_path / f"se-{seed}.json", doc))
    combined = results.combine(paths)
    out = tmp_path / "se.json"
    results.write(
        out,
        {
            "benchmark": "sample_efficiency",
            **combined["meta"],
            "targets": stats.summarize(combined["runs"]),
            "runs": combined["runs"],
        },
    )
    r = run_cli(
        "report",
        "--out",
        str(tmp_path / "r.html"),
        "--sample-efficiency",
        str(out),
        "--store",
        str(demo_store.root),
    )
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text()
    se = _se_data(page)
    assert [p["target"] for p in se["targets"]] == ["shop", "shop-mixed"] and se["commits"] == ["c0", "c1"]
    boot = se["targets"][1]["bootstrap"]["640"]
    assert boot["difference"]["mean"] == 0.3 and boot["ratio"]["interval_95"] == [2.0, 3.0]
    assert "90 % lower bound +0.200" in page and "95 % interval [2.00, 3.00]" in page
    assert "commit(s) c0, c1 (clean)" in page
    assert "Pre-registered decision" not in page  # not a registered run: no verdict
    doc = json.loads(out.read_text())
    doc["verdict"] = {
        "rule": "gain ratio >= 2 and 90 % lower bound of TRACE gain - GRPO gain > 0 at 640 rollouts",
        "budget": 640,
        "gain_ratio": 2.5,
        "difference_lower_90": 0.2,
        "runs": {"grpo_target": 2, "trace": 2},
        "complete": True,
        "ratio_met": True,
        "lower_bound_met": True,
        "holds": True,
    }
    results.write(out, doc)
    r = run_cli(
        "report",
        "--out",
        str(tmp_path / "v.html"),
        "--sample-efficiency",
        str(out),
        "--store",
        str(demo_store.root),
    )
    assert r.exit_code == 0, r.output
    assert (
        "at 640 rollouts): holds: gain ratio 2.50×, 90 % lower bound +0.200"
        in (tmp_path / "v.html").read_text()
    )


def test_report_bad_input_exits_2_and_writes_nothing(demo_store, tmp_path):
    before = snapshot(demo_store.root)
    out = tmp_path / "x.html"
    out.write_text("keep")
    r = run_cli("report", "--out", str(out), "--store", str(demo_store.root))
    assert r.exit_code == 2 and "already exists" in r.output and out.read_text() == "keep"
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    r = run_cli(
        "report",
        "--out",
        str(tmp_path / "y.html"),
        "--sample-efficiency",
        str(bad),
        "--store",
        str(demo_store.root),
    )
    assert r.exit_code == 2 and "budgets" in r.output and not (tmp_path / "y.html").exists()
    r = run_cli("report", "--out", str(tmp_path / "no" / "z.html"), "--store", str(demo_store.root))
    assert r.exit_code == 2 and "no such directory" in r.output
    assert snapshot(demo_store.root) == before


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
def test_report_renders_in_headless_chromium(demo_store, tmp_path):
    out = tmp_path / "report.html"
    assert run_cli("report", "--out", str(out), "--store", str(demo_store.root)).exit_code == 0
    shot = tmp_path / "shot.png"
    # the page reports its images' decoded sizes into the DOM title; --dump-dom prints the rendered DOM
    probe = tmp_path / "probe.html"
    probe.write_text(
        out.read_text().replace(
            "</body>",
            "<script>window.onload=()=>{const i=[...document.images];document.title='IMAGES:'+i.length+':'"
            "+i.filter(x=>x.complete&&x.naturalWidth>0).length};</script></body>",
        )
    )
    args = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ]
    dom = subprocess.run(
        [*args, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    m = re.search(r"<title>IMAGES:(\d+):(\d+)</title>", dom.stdout)
    assert m, dom.stderr[-500:]
    assert int(m.group(1)) == int(m.group(2)) >= 3  # every embedded image decoded in the browser
    subprocess.run(
        [*args, "--window-size=1200,3000", f"--screenshot={shot}", out.as_uri()],
        capture_output=True,
        timeout=120,
    )
    from PIL import Image

    im = Image.open(shot).convert("L")
    assert im.size == (1200, 3000)
    lo, hi = im.getextrema()
    assert hi - lo > 100  # something was drawn


def test_a_recipe_step_that_fans_out_keeps_its_name_key_artifacts(tmp_path):
    """synthesize without a capability writes NAME-CAPABILITY artifacts: a report for the recipe keeps them."""
    from types import SimpleNamespace

    from trace_cli.report.collect import _keep, recipe_names

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "kind: recipe\nversion: 1\nname: r\nsteps:\n"
        "  - {id: envs, uses: synthesize, name: envs, with: {diagnosis: 'store://diagnosis/d', target: shop,"
        " model: 'policy:reference'}}\n"
        "  - {id: ev, uses: eval, name: ev, with: {model: 'policy:reference', env: shop}}\n"
    )
    only = recipe_names(recipe)
    assert only == {"envs-*", "ev"}
    art = SimpleNamespace(kind="environment", id="abc")
    assert _keep(art, {("environment", "abc"): ["envs-precondition_verification"]}, only)
    assert not _keep(art, {("environment", "abc"): ["other-precondition_verification"]}, only)
    assert not _keep(art, {("environment", "abc"): ["envs"]}, only)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
def test_the_first_screen_answers_what_the_loop_found_and_fixed_in_chromium(demo_store, tmp_path):
    """docs/screenshot.py (which made docs/report-first-screen.png) over a real store: in a 1280x900 window
    the first screen holds the findings and the benchmark's verdict beside them, laid out side by side."""
    committed = REPO / "benchmarks" / "results" / "sample_efficiency_mixed.json"
    out = tmp_path / "report.html"
    r = run_cli(
        "report", "--out", str(out), "--sample-efficiency", str(committed), "--store", str(demo_store.root)
    )
    assert r.exit_code == 0, r.output
    probe = tmp_path / "probe.html"
    probe.write_text(
        out.read_text().replace(
            "</body>",
            "<script>window.onload=()=>{const f=document.querySelector('.first').getBoundingClientRect();"
            "const v=document.querySelector('.verdict').getBoundingClientRect();"
            "document.title='FIRST:'+Math.round(f.top)+':'+Math.round(v.left)+':'+Math.round(v.top)+':'"
            "+document.querySelector('.verdict').innerText.replace(/\\s+/g,' ')};</script></body>",
        )
    )
    sys.path.insert(0, str(REPO / "docs"))
    try:
        import screenshot
    finally:
        sys.path.remove(str(REPO / "docs"))
    dom = screenshot.chromium(
        "--window-size=1280,900",
        "--virtual-time-budget=5000",
        "--dump-dom",
        probe.as_uri(),
        profile=tmp_path / "profile",
    )
    m = re.search(r"<title>FIRST:(\d+):(\d+):(\d+):(.*?)</title>", dom.stdout, re.S)
    assert m, dom.stderr[-500:]
    top, verdict_left, verdict_top, verdict = int(m[1]), int(m[2]), int(m[3]), m[4]
    assert top < 200 and verdict_top < 300  # the findings and the verdict open the page
    assert verdict_left > 640  # beside the findings, not below them
    assert "does not hold" in verdict and "0.76×" in verdict
    shot = tmp_path / "shot.png"
    res = subprocess.run(
        [
            sys.executable,
            str(REPO / "docs" / "screenshot.py"),
            "--store",
            str(demo_store.root),
            "--out",
            str(shot),
            "--sample-efficiency",
            str(committed),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    from PIL import Image

    im = Image.open(shot).convert("L")
    assert im.size == (1280, 900)
    lo, hi = im.getextrema()
    assert hi - lo > 100
    # the committed picture is the same kind of screen
    committed_shot = Image.open(REPO / "docs" / "report-first-screen.png")
    assert committed_shot.size == (1280, 900)

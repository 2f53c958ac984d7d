"""`trace report`'s first screen pairs like with like: each adapter and each composition against evaluations of
its own base on the same environment and seeds (from the artifacts' recorded inputs), per task family."""

from __future__ import annotations

from trace_testing import run_cli

from trace_cli.stages.base import execute

EVAL = {"max_new_tokens": 6, "max_turns": 2}


def test_findings_pair_adapters_and_compositions_with_their_base(composed_store, tiny, tmp_path):
    from trace_cli.report.collect import findings

    st = composed_store
    router = execute(
        "compose",
        {"method": "router", "adapters": ["store://adapter/structured", "store://adapter/tool"]},
        st,
    ).main
    runs = {
        "base-sdr": (str(tiny.hf), "cx-sdr", "0:3"),
        "structured-sdr": ("store://adapter/structured", "cx-sdr", "0:3"),
        "structured-other-seeds": (
            "store://adapter/structured",
            "cx-sdr",
            "3:5",
        ),  # no base run on these seeds
        "base-shop": (str(tiny.hf), "shop", "0:4"),
        "router-shop": (router.uri, "shop", "0:4"),
    }
    got = {}
    for name, (model, env, seeds) in runs.items():
        got[name] = execute(
            "eval", {"model": model, "env": env, "seeds": seeds, **EVAL}, st, name=name
        ).outputs["eval"]
    f = findings(st)
    adapters = {(a["name"], a["seeds"]): a for a in f["adapters"]}
    a = adapters[("structured", "0:3")]
    assert a["capability"] == "structured_data_reasoning" and a["env"] == "cx-sdr"
    assert a["pass@1"] == got["structured-sdr"].summary["pass@1"]
    assert a["base_pass@1"] == got["base-sdr"].summary["pass@1"]
    assert adapters[("structured", "3:5")]["base_pass@1"] is None  # never compared across seeds
    assert ("tool", "0:3") not in adapters  # not evaluated: not shown
    [c] = [c for c in f["compositions"] if c["method"] == "router"]
    assert c["env"] == "shop" and c["base_pass@1"] == got["base-shop"].summary["pass@1"]
    fams = got["router-shop"].summary["families"]
    assert set(c["families"]) == set(fams) | set(got["base-shop"].summary["families"])
    for fam, v in fams.items():
        assert c["families"][fam]["this"] == v["pass@1"]
    # the page's first screen and the table the CLI prints show them
    out = tmp_path / "r.html"
    r = run_cli("report", "--out", str(out), "--store", str(st.root))
    assert r.exit_code == 0, r.output
    page = out.read_text()
    first = page.split("<h2>", 2)[1]
    assert first.startswith("What the loop found and fixed") and "structured" in first and "router" in first
    assert "composition" in r.stdout and "structured" in r.stdout

"""recipes/quick.yaml is the demo's loop with smaller budgets: the same steps, stages and references, never a
larger budget (so what `docs/report-first-screen.png` shows is the demo's loop, only noisier)."""

from __future__ import annotations

import yaml
from trace_testing import REPO


def _steps(name: str) -> dict[str, dict]:
    return {s["id"]: s for s in yaml.safe_load((REPO / "recipes" / name).read_text())["steps"]}


def _seeds(spec: str) -> int:
    a, b = (int(x) for x in spec.split(":"))
    return b - a


def test_quick_recipe_is_the_demo_loop_with_smaller_budgets():
    demo, quick = _steps("demo.yaml"), _steps("quick.yaml")
    assert list(quick) == list(demo)
    smaller = 0
    for sid, d in demo.items():
        q = quick[sid]
        assert q["uses"] == d["uses"], sid
        dw, qw = d.get("with") or {}, q.get("with") or {}
        assert set(qw) == set(dw), sid
        for k, v in dw.items():
            w = qw[k]
            if isinstance(v, str) and v.startswith("${"):
                assert w == v, (sid, k)  # the same wiring
            elif k == "seeds" and isinstance(v, str):
                assert _seeds(w) <= _seeds(v), (sid, k)
                smaller += _seeds(w) < _seeds(v)
            elif k in ("max_steps", "per_device_batch_size", "steps") and isinstance(v, int):
                assert w <= v, (sid, k)
                smaller += w < v
    assert smaller >= 5

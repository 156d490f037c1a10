"""Issue 36, finding 4 (verifiers): `rollout.agent.program=verifiers` synced its harness from PyPI in every episode;
offline each episode failed. The harness is now built once, before step 1 (`uv sync --script` of verifiers' uv
scripts, honouring UV_OFFLINE / UV_CACHE_DIR), and one that cannot be built stops the run at its start-up check
with one error naming the harness, the command, uv's words and the fix.

verifiers itself is stood in for by a package holding one PEP 723 harness script, and uv by a script that, as uv
does with UV_OFFLINE=1 and an empty cache, cannot resolve it (there is no network here either)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import grpoflow.trajectories.verifiers_agent as adapter
from grpoflow.commands.run import train
from grpoflow.config import ConfigError, load_config

FAKE_UV = """#!/bin/sh
echo "$@" >> "$UV_LOG"
if [ "$UV_OFFLINE" = "1" ]; then
  echo "  x No solution found when resolving script dependencies:" >&2
  echo "  -> Because openai was not found in the cache and you require openai, we can conclude that your" >&2
  echo "     requirements are unsatisfiable." >&2
  echo "     hint: Packages were unavailable because the network was disabled." >&2
  exit 1
fi
exit 0
"""


@pytest.fixture
def fake_verifiers(tmp_path, monkeypatch) -> Path:
    """A `verifiers` package with one uv harness script, a fake `uv` on PATH; returns uv's call log."""
    pkg = tmp_path / "site" / "verifiers"
    (pkg / "v1" / "harnesses").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "v1" / "__init__.py").write_text("")
    (pkg / "v1" / "harnesses" / "chat_loop.py").write_text(
        '# /// script\n# requires-python = ">=3.10"\n# dependencies = ["openai>=1", "mcp"]\n# ///\nprint("harness")\n')
    (pkg / "v1" / "harnesses" / "helpers.py").write_text("X = 1\n")  # not a uv script: not built
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").write_text(FAKE_UV)
    (bin_dir / "uv").chmod(0o755)
    log = tmp_path / "uv.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("UV_LOG", str(log))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [m for m in sys.modules if m == "verifiers" or m.startswith("verifiers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(adapter, "_prepared", set())
    return log


def test_an_offline_harness_stops_the_run_before_step_1_with_one_clear_error(fake_verifiers, tmp_path, monkeypatch):
    monkeypatch.setenv("UV_OFFLINE", "1")
    cfg = load_config(None, [f"trainer.output_dir={tmp_path / 'run'}", "data.train_files=[verifiers:reverse_text]",
                             "rollout.agent.program=verifiers", "rollout.agent.args={agent: {harness: {id: null}}}",
                             "reward.function=null", "trainer.total_steps=2"])
    with pytest.raises(ConfigError) as caught:
        train(cfg)
    message = str(caught.value)
    assert "verifiers' harness 'null' (the uv script chat_loop.py) could not be built before step 1" in message
    assert "`uv sync --script " in message and "chat_loop.py` exited 1" in message
    assert "UV_OFFLINE is set" in message and "openai was not found in the cache" in message  # uv's own words
    assert "Fix: build it once on a machine that reaches PyPI" in message and "UV_CACHE_DIR" in message
    calls = fake_verifiers.read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("sync --script ") and calls[0].endswith("chat_loop.py")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no step ran


def test_a_harness_that_builds_is_built_once_per_process(fake_verifiers, monkeypatch):
    monkeypatch.delenv("UV_OFFLINE", raising=False)
    from grpoflow.trajectories.agents import load_agent

    load_agent("verifiers", {"agent": {"harness": {"id": None}}})
    load_agent("verifiers", {"agent": {"harness": {"id": None}}})  # the start-up check, then a rollout worker
    assert len(fake_verifiers.read_text().splitlines()) == 1
    load_agent("verifiers", {"agent": {"runtime": {"type": "docker"}}})  # a container brings its own harness
    assert len(fake_verifiers.read_text().splitlines()) == 1

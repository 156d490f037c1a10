"""Issue 36, finding 4 (verifiers): `rollout.agent.program=verifiers` left verifiers to build its harness program
(a uv script) in the first episode of each process, with UV_OFFLINE forced to false; offline, every episode of
step 1 failed. Now the harness is built before step 1, with the user's uv settings (trajectories/verifiers_harness.py):

- offline with a cache that lacks it, `grpoflow train` stops at its start-up check with one error naming the
  harness, the uv command, uv's own words and the fix, exit code 2, and the run folder is left as it was;
- offline with a cache that holds it (filled by an online build), the harness is built from the cache alone, into
  verifiers' table of built programs, so that no episode builds it; only uv's cache folder is reused (a fresh
  ~/.cache/verifiers: another machine with the cache folder copied).

Real verifiers, real uv; the network is shut with a closed port as the proxy, so nothing leaks online even where
verifiers forces uv online (UV_OFFLINE=false). Skipped without verifiers (.ci/envs_stage installs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"  # vf_echo, a taskset written with verifiers' API
NULL = "rollout.agent.args={agent: {harness: {id: null}}}"
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens


def uv_bin() -> str:
    """The extra's uv: on PATH, or beside this python."""
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("uv is not installed (pip install 'grpoflow[verifiers]')")
    return found


def offline_env(home: Path, uv_cache: Path) -> dict[str, str]:
    """A fresh HOME (so a fresh ~/.cache/verifiers), uv offline on `uv_cache`, and no way out to the network."""
    uv = uv_bin()
    path = os.pathsep.join([str(Path(uv).parent), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(filter(None, [str(INTEGRATION), os.environ.get("PYTHONPATH")]))
    env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
    return {**env, "HOME": str(home), "PATH": path, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1",
            "GRPOFLOW_DEBUG": "", "UV_OFFLINE": "1", "UV_CACHE_DIR": str(uv_cache),
            **{name: CLOSED for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy")}}


def test_offline_without_the_harness_in_the_cache_the_run_stops_before_step_1_with_one_error(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("kept")  # something already in the run folder: it must not be touched
    (tmp_path / "uv-cache").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "grpoflow.cli", "train", "model.path=builtin:tiny-0.5m",
         "data.train_files=[verifiers:vf_echo]", "rollout.agent.program=verifiers", NULL, "reward.function=null",
         "sft.steps=0", "trainer.total_steps=1", f"trainer.output_dir={out}"],
        cwd=tmp_path, env=offline_env(tmp_path / "home", tmp_path / "uv-cache"), capture_output=True, text=True,
        timeout=300)
    err = result.stderr
    assert result.returncode == 2, err[-3000:]
    assert "Traceback" not in err and err.count("grpoflow train: error:") == 1, err[-3000:]
    assert "grpoflow train: error: rollout.agent.program=verifiers: verifiers' harness 'null' could not be built " \
           "before step 1: `uv lock --script " in err, err[-3000:]
    assert "UV_OFFLINE is set, so uv looked only in its cache" in err and str(tmp_path / "uv-cache") in err
    assert "uv said:\n" in err and "network" in err.split("uv said:\n", 1)[1]  # uv's words: the network is off
    assert "Fix: build it once where uv reaches its index" in err and "UV_OFFLINE=1 and UV_CACHE_DIR" in err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and (out / "notes.txt").read_text() == "kept"


BUILD = """
from verifiers.v1.runtimes import SubprocessRuntime
from grpoflow.trajectories.agents import load_agent

load_agent("verifiers", {"agent": {"harness": {"id": None}}}, data_files=["verifiers:vf_echo"])
print(sorted(SubprocessRuntime._interpreters))   # verifiers' table of built programs: an episode builds nothing
"""


def test_offline_with_the_harness_in_uv_cache_it_is_built_from_the_cache_alone(tmp_path, monkeypatch):
    from grpoflow.trajectories.agents import load_agent

    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(uv_bin()).parent), os.environ.get("PATH", "")]))
    # the build online, as a first run does (the integration tests' cache; uv's default unless UV_CACHE_DIR is set)
    online = {k: v for k, v in os.environ.items() if not k.upper().startswith("UV_OFFLINE")}
    uv_cache = subprocess.run([uv_bin(), "cache", "dir"], capture_output=True, text=True, check=True,
                              env=online).stdout.strip()
    sys.path.insert(0, str(INTEGRATION))
    try:
        load_agent("verifiers", {"agent": {"harness": {"id": None}}}, data_files=["verifiers:vf_echo"])
    finally:
        sys.path.remove(str(INTEGRATION))
    # then offline, in a new process, with only uv's cache kept (a fresh ~/.cache/verifiers, no lock in it)
    result = subprocess.run([sys.executable, "-c", BUILD], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=offline_env(tmp_path / "home", Path(uv_cache)))
    assert result.returncode == 0, result.stderr[-3000:]
    scripts = tmp_path / "home" / ".cache" / "verifiers" / "runtimes" / "scripts"
    built = [p for p in scripts.glob("*.py")]
    assert len(built) == 1 and (scripts / f"{built[0].name}.lock").is_file()   # the chat program, locked offline
    assert result.stdout.strip() == repr([str(built[0])])

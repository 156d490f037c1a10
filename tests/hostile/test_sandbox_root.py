"""Issue 53, finding 1: model-written code in the `python` tool is never root.

Where Python lived under /root (this project's machines), each call stayed root with every capability: it appended to
a root-only file, wrote a `.pth` into the venv (run by every later interpreter), signalled the trainer and killed a
peer call. Now a root trainer runs its workers in bubblewrap's read-only view (test_in_the_view...), or, without
one, gives each worker's calls a uid of their own where that uid can read Python (test_with_the_calls_uid_only...,
run here inside an outer bubblewrap that makes Python readable), or refuses the tool at start (test_without_a_view).

GRPOFLOW_SANDBOX_REQUIRED=1 (the hostile CI stage) makes a missing bubblewrap fail these tests instead of skipping.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grpoflow import sandbox
from grpoflow.errors import UserError
from grpoflow.trajectories.tool_runner import ToolRunner
from grpoflow.trajectories.tools import load_tools
from sandbox_escapes import attempt_escapes

ROOT = os.geteuid() == 0
REQUIRED = os.environ.get("GRPOFLOW_SANDBOX_REQUIRED") == "1"
pytestmark = pytest.mark.skipif(not ROOT, reason="the trainer is not root: its calls keep its uid")


def _need_bwrap() -> None:
    problem = sandbox._bwrap_problem(sandbox.BWRAP) if sandbox.BWRAP else "bwrap is not installed"
    if problem is not None:
        if REQUIRED:
            pytest.fail(f"bubblewrap is required here (GRPOFLOW_SANDBOX_REQUIRED=1): {problem}")
        pytest.skip(f"no working bubblewrap ({problem}): apt-get install bubblewrap")


def _check_common(result: dict) -> None:
    out = result["outputs"]
    assert result["secret"] == "root's\n" and out["append_secret"] != "done\n", out["append_secret"]
    assert "root's" not in out["read_secret"]
    assert not result["wrote_pth"] and out["write_pth"] != "done\n", "a call wrote a .pth into site-packages"
    assert not result["trainer_signalled"] and out["signal_trainer"] != "done\n", "a call signalled the trainer"
    assert out["peer"] == "alive\n" and out["peer_killer"] == "killed []\n", (out["peer"], out["peer_killer"])
    uid, euid = map(int, out["uid"].split())
    assert uid != 0 and euid != 0, "a call ran as root"


@pytest.fixture
def folder():
    """A folder of the test's own: other pytest sessions of root on a shared machine prune pytest's basetemp."""
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


def test_in_the_view_no_escape_works(folder):
    _need_bwrap()
    result = attempt_escapes(folder)
    _check_common(result)
    assert not result["wrote_tmp"], "a call in the read-only view wrote to /tmp"


def test_with_the_calls_uid_only_no_escape_works(folder, monkeypatch):
    paths = sandbox.import_paths()
    blocked = sandbox.blocked_folders(sandbox.python_dirs())
    if not blocked:  # Python is readable by any uid here: the plain mode as it is
        monkeypatch.setattr(sandbox, "BWRAP", None)
        _check_common(attempt_escapes(folder))
        return
    _need_bwrap()  # Python under /root: run the trainer in an outer bubblewrap that makes it readable, keeping root
    outer = [sandbox.BWRAP, "--bind", "/", "/", "--dev-bind", "/dev", "/dev", "--bind", "/proc", "/proc"]
    for folder in blocked:
        outer += ["--tmpfs", folder]
        for path in paths:
            if path.startswith(folder + os.sep):
                parts = os.path.relpath(path, folder).split(os.sep)
                for k in range(1, len(parts)):
                    outer += ["--perms", "0755", "--dir", os.path.join(folder, *parts[:k])]
                outer += ["--ro-bind", path, path]
    script = Path(__file__).with_name("sandbox_escapes.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(sandbox.__file__).parents[1]), str(script.parent)])}
    done = subprocess.run([*outer, "--", sys.executable, str(script), str(folder)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_common(json.loads(done.stdout.splitlines()[-1]))


def test_without_a_view_where_python_is_unreadable_the_tool_is_refused_at_start(monkeypatch):
    blocked = sandbox.blocked_folders(sandbox.python_dirs())
    if not blocked:
        pytest.skip("every uid can read Python here: the calls run under their own uid without a view")
    monkeypatch.setattr(sandbox, "BWRAP", None)
    (python,) = load_tools(["python"])
    with pytest.raises(UserError) as refused:
        ToolRunner([python], workers=1)
    message = str(refused.value)
    assert "\n" not in message and f"cannot read {blocked[0]}" in message
    assert "apt-get install bubblewrap" in message and f"chmod o+rx {blocked[0]}" in message


def test_a_worker_whose_calls_could_not_read_python_refuses_to_start():
    uid = sandbox.call_uid(os.getpid())
    with tempfile.TemporaryDirectory() as top:  # /tmp/x (0700 as made) holding lib (0755)
        (Path(top) / "lib").mkdir(mode=0o755)
        assert sandbox.probe_call_uid(uid, [f"{top}/lib"]) == \
            f"uid {uid} cannot read {top}, where Python lives ({sys.base_prefix})"
        os.chmod(top, 0o755)
        assert sandbox.probe_call_uid(uid, [f"{top}/lib"]) is None

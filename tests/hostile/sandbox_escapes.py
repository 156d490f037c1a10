"""Issue 53: what model-written code in the `python` tool tried when its calls ran as root, run again.

`attempt_escapes(folder)` starts a ToolRunner of two workers and makes calls that: append to a root-only file in
a 0700 folder, write to /tmp, write a `.pth` into the venv's site-packages, send SIGUSR1 to the trainer, and, while
a peer call sleeps, SIGKILL every process of this trainer's workers it can see (the peer's included). It returns
what happened, for the test to check. Run as a script (`python sandbox_escapes.py FOLDER`), it does the same
without bubblewrap (the calls' uid only) and prints the result as JSON: tests/hostile/test_sandbox_root.py runs it
so inside an outer bubblewrap that makes Python readable, as on a machine where Python is installed for every user.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import sysconfig
import time
from pathlib import Path

from grpoflow import sandbox
from grpoflow.data.tool_format import ToolCall
from grpoflow.trajectories.builtin_tools import python as python_tool
from grpoflow.trajectories.tool_runner import ToolRunner
from grpoflow.trajectories.tools import Tool

# The python tool, built without load_tools (whose schema builder imports transformers and torch: 8 s of this test)
PYTHON = Tool("python", python_tool, {"type": "function", "function": {"name": "python"}}, sandboxed=True)

# SIGKILL every process of this trainer's workers it can see but itself and its worker: their command line ends
# with the trainer's pid (its worker's, without a view) or 1 (its worker's parent in the view).
PEER_KILLER = '''
import os, signal
mine, hits = {{os.getpid(), os.getppid()}}, []
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) in mine:
        continue
    try:
        args = open(f"/proc/{{name}}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if len(args) > 2 and b"child_main" in b" ".join(args) and args[-2] in (b"{trainer}", b"1"):
        try:
            os.kill(int(name), signal.SIGKILL)
            hits.append(int(name))
        except OSError as e:
            pass
print("killed", hits)
'''


def _attempt(code: str) -> str:
    return f"try:\n    {code}\n    print('done')\nexcept OSError as e:\n    print(type(e).__name__)\n"


def attempt_escapes(folder: Path) -> dict:
    """Run the attacks (the module docstring) and return what each achieved."""
    secret_dir = folder / "root-only"
    secret_dir.mkdir(mode=0o700)
    secret = secret_dir / "secret.txt"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    token = f"{os.getpid()}-{time.time_ns()}"
    pth = Path(sysconfig.get_paths()["purelib"]) / f"zz_hostile_{token}.pth"
    tmp_file = Path("/tmp") / f"grpoflow-hostile-{token}"
    got_signal: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda number, frame: got_signal.append(number))
    try:
        with ToolRunner([PYTHON], timeout_s=20.0, workers=2) as runner:
            calls = {
                "append_secret": _attempt(f"open({str(secret)!r}, 'a').write('pwned')"),
                "read_secret": _attempt(f"print(open({str(secret)!r}).read())"),
                "write_tmp": _attempt(f"open({str(tmp_file)!r}, 'w').write('x')"),
                "write_pth": _attempt(f"open({str(pth)!r}, 'w').write('import os')"),
                "signal_trainer": _attempt(f"__import__('os').kill({os.getpid()}, {int(signal.SIGUSR1)})"),
            }
            outputs = {name: r.content for name, r in
                       zip(calls, runner.run([ToolCall("python", {"code": c}) for c in calls.values()]))}
            peer, killer = runner.run([
                ToolCall("python", {"code": "import time\ntime.sleep(2)\nprint('alive')"}),
                ToolCall("python", {"code": "import time\ntime.sleep(0.5)\n"
                                            + PEER_KILLER.format(trainer=os.getpid())}),
            ])
            outputs["peer"], outputs["peer_killer"] = peer.content, killer.content
            uid = runner.run([ToolCall("python", {"code": "import os\nprint(os.getuid(), os.geteuid())"})])[0]
            outputs["uid"] = uid.content
        time.sleep(0.1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        wrote_pth = pth.exists()
        pth.unlink(missing_ok=True)
        wrote_tmp = tmp_file.exists()
        tmp_file.unlink(missing_ok=True)
    return {"outputs": outputs, "secret": secret.read_text(), "wrote_pth": wrote_pth, "wrote_tmp": wrote_tmp,
            "trainer_signalled": bool(got_signal)}


if __name__ == "__main__":  # the calls' uid only: no bubblewrap around the workers
    sandbox.BWRAP = None
    print(json.dumps(attempt_escapes(Path(sys.argv[1]))))

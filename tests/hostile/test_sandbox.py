"""Finding 1: code in the sandboxed `python` tool must not reach the trainer's memory or outlive its worker.

The attacks are what model-written code can do from inside its worker: find the reply channel (through `gc`,
the worker's own frames, or /proc/self/fd) and write to it, start processes that leave the worker's process
group, write straight to fd 1, raise its own limits, read the trainer's environment.
"""

import os
import textwrap
import time
from pathlib import Path

import pytest

from grpoflow.data.tool_format import ToolCall
from grpoflow.trajectories.tool_runner import ToolRunner
from grpoflow.trajectories.tools import load_tools

# Sends an object whose unpickling runs `exec(...)`, which writes the unpickling process's pid to MARKER.
# It tries every channel it can find: multiprocessing Connections (gc), and every pipe or socket fd, written
# with the 4-byte length prefix that Connection and grpoflow's reply frames both use.
PICKLE_ATTACK = textwrap.dedent('''
    import gc, os, pickle, struct
    class Evil:
        def __reduce__(self):
            return (exec, ("open({marker!r}, 'w').write(str(__import__('os').getpid()))",))
    blob = pickle.dumps(("ok", Evil()))
    try:
        from multiprocessing.connection import Connection
        for conn in [o for o in gc.get_objects() if isinstance(o, Connection)]:
            try:
                conn.send(("ok", Evil()))
            except Exception:
                pass
    except Exception:
        pass
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            target = os.readlink(f"/proc/self/fd/{{fd}}")
            if target.startswith(("pipe:", "socket:")) and fd > 2:
                os.write(fd, struct.pack("!i", len(blob)) + blob)
        except OSError:
            pass
    print("sent")
''')

# Forges the reply to its own call (with the current request id where it can find one), then returns normally,
# so the worker's real reply comes second.
FORGE_ATTACK = textwrap.dedent('''
    import gc, json, os, struct, sys
    forged = False
    try:
        from multiprocessing.connection import Connection
        for conn in [o for o in gc.get_objects() if isinstance(o, Connection)]:
            conn.send(("ok", ("ok", "FORGED")))
            forged = True
    except Exception:
        pass
    if not forged:
        frame, request_id, fd = sys._getframe(), None, None
        while frame is not None:
            request_id = frame.f_locals.get("request_id", request_id)
            fd = frame.f_locals.get("reply_fd", fd)
            frame = frame.f_back
        body = json.dumps({"id": request_id, "kind": "ok", "info": ["ok", "FORGED"]}).encode()
        os.write(fd, struct.pack("!I", len(body)) + body)
    print("real output of the first call")
''')


@pytest.fixture
def runner():
    (python,) = load_tools(["python"])
    with ToolRunner([python], timeout_s=10.0, cpu_time_s=10.0, memory_mb=300, workers=1) as runner:
        yield runner


def python_call(runner, code: str):
    (result,) = runner.run([ToolCall("python", {"code": code})])
    return result


def test_a_pickle_sent_by_tool_code_never_runs_in_the_trainer(runner, tmp_path):
    marker = tmp_path / "pwned"
    result = python_call(runner, PICKLE_ATTACK.format(marker=str(marker)))
    time.sleep(0.2)
    assert not marker.exists(), f"the tool's pickle ran in process {marker.read_text()} (the trainer is {os.getpid()})"
    assert result.content != "FORGED"
    assert python_call(runner, "print(6 * 7)").content == "42\n"  # the runner goes on


def test_a_forged_reply_is_never_given_to_the_next_call(runner):
    python_call(runner, FORGE_ATTACK)  # its own result may be forged: the code decides what it prints anyway
    second = python_call(runner, "print('second')")
    assert second.content != "real output of the first call\n", "the first call's reply was given to the second"
    assert second.content == "second\n" or second.status == "error"
    assert python_call(runner, "print('third')").content == "third\n"


def test_the_tool_does_not_see_the_trainers_environment(monkeypatch):
    monkeypatch.setenv("GRPOFLOW_HOSTILE_API_KEY", "sk-secret")
    (python,) = load_tools(["python"])
    with ToolRunner([python], workers=1) as runner:
        result = python_call(runner, "import os\nprint(sorted(os.environ))\n"
                                     "print(os.environ.get('GRPOFLOW_HOSTILE_API_KEY'))")
    assert "sk-secret" not in result.content and result.content.endswith("None\n")


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_setsid_and_double_forked_children_do_not_outlive_the_worker():
    token = f"{os.getpid() % 1000}.{time.time_ns() % 100000}"
    code = textwrap.dedent(f'''
        import os, subprocess
        started = []
        try:
            started.append(subprocess.Popen(["sleep", "{token}1"], start_new_session=True).pid)
        except OSError as e:
            print("setsid child refused:", type(e).__name__)
        try:
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execvp("sleep", ["sleep", "{token}2"])
                os._exit(0)
        except OSError as e:
            print("fork refused:", type(e).__name__)
        print(started)
    ''')
    (python,) = load_tools(["python"])
    runner = ToolRunner([python], timeout_s=5.0, workers=1)
    try:
        python_call(runner, code)
        python_call(runner, "import time\ntime.sleep(30)")  # times out: the worker is killed
    finally:
        runner.close()
    deadline = time.monotonic() + 3
    while _processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _processes_with(token)
    for pid in left:  # clean up what the old code let escape
        os.kill(pid, 9)
    assert not left, f"processes started by the tool outlived its worker: {left}"


def test_os_write_to_fd_1_and_2_is_captured(runner):
    result = python_call(runner, "import os\nos.write(1, b'raw out\\n')\nprint('printed')\n"
                                 "_ = os.write(2, b'raw err\\n')")
    assert result.content == "raw out\nprinted\nraw err\n"


def test_the_tool_cannot_raise_its_memory_hard_limit(runner):
    code = textwrap.dedent('''
        import resource
        try:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            print("raised")
        except (ValueError, OSError) as e:
            print("refused")
    ''')
    assert python_call(runner, code).content == "refused\n"
    big = python_call(runner, "x = bytearray(10**9)")
    assert big.status == "killed"


def test_the_tool_runs_without_privileges_in_a_folder_of_its_own(runner):
    code = ("import os\nprint(os.getuid(), os.getcwd(), sorted(os.listdir('.')))\n"
            "print(open('/proc/self/status').read())")
    content = python_call(runner, code).content
    uid, cwd, _ = content.splitlines()[0].split(" ", 2)
    assert "NoNewPrivs:\t1" in content
    assert cwd != os.getcwd() and not Path(os.getcwd()).is_relative_to(cwd)
    if os.geteuid() == 0:
        assert int(uid) != 0, "the tool ran as root"  # issue 53: never, wherever Python lives


# Issue 36, finding 2: every call starts from a pristine interpreter (a child forked per call).
FORGERY = textwrap.dedent('''
    import builtins, math
    real_print = print
    builtins.print = lambda *a, **k: real_print("FORGED")
    math.sqrt = lambda x: -1.0
    open("note.txt", "w").write("left for the next call")
''')


def test_a_call_that_replaces_print_or_math_sqrt_does_not_forge_a_later_call(runner):
    python_call(runner, FORGERY)
    later = python_call(runner, "import math, os\nprint(math.sqrt(16.0), os.listdir('.'))")
    assert later.content == "4.0 []\n", later


def test_random_seed_in_one_call_does_not_fix_another_calls_draws(runner):
    draw = "import random\nprint(random.random())"
    before = python_call(runner, draw).content
    seeded = python_call(runner, "import random\nrandom.seed(0)\nprint(random.random())").content
    after = python_call(runner, draw).content
    assert after != seeded and after == before  # a call's draws depend on its code only: resume gives the same


# Issue 36, finding 3: the sandbox works where Python lives.
def test_the_standard_library_works_in_the_sandbox(runner):
    code = ("import glob, statistics, fractions, decimal, datetime, os\n"
            "print(statistics.mean([1, 2]), fractions.Fraction(1, 3), os.environ['OPENBLAS_NUM_THREADS'])")
    assert python_call(runner, code).content == "1.5 1/3 1\n"

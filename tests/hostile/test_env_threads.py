"""Issue 53, leftovers: an environment's threads neither pile up nor keep the process alive.

A `close` that hangs left one thread per trajectory per step; a non-daemon thread an environment started kept
`grpoflow train` alive after "done". Now at most MAX_LEFT_BEHIND calls are left running (later ones fail without a
thread; one step's calls may start while the limit is not yet reached), and the command exits after its last
line whatever threads remain.
"""

import subprocess
import sys
import threading
from pathlib import Path

from grpoflow.data.dataset import PromptItem
from grpoflow.engines.protocol import SamplingParams
from grpoflow.models.tiny import build_char_tokenizer
from grpoflow.trajectories import env as env_module
from grpoflow.trajectories.chat import ChatRenderer
from grpoflow.trajectories.env import GuessNumber
from grpoflow.trajectories.loop import EnvLoop

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from scripted import ScriptedEngine, play  # noqa: E402  (tests/unit's scripted engine)

RELEASE = threading.Event()


class HangingClose(GuessNumber):
    def close(self):
        RELEASE.wait(60)


def test_hung_close_calls_leave_at_most_max_left_behind_threads(caplog):
    tok = build_char_tokenizer()
    renderer = ChatRenderer(tok)
    engine = ScriptedEngine(tok, lambda text: "4", renderer.turn.end_token_id)
    loop = EnvLoop(renderer, env_cls=HangingClose, tools=None, max_turns=1, env_timeout_s=0.2,
                   opening=lambda row: [{"role": "user", "content": row["prompt"]}])
    rows = [PromptItem(prompt_ids=[], prompt_text="", row={"prompt": "Guess 1-8", "secret": 3}, data_source="g",
                       index=i) for i in range(40)]
    try:
        for step in range(4):  # 160 closes, each hanging; before, every one was left running
            play(loop, engine, rows, SamplingParams(n=1, max_new_tokens=20, temperature=1.0), seed=step)
        hung = [t for t in threading.enumerate() if t.name == "grpoflow-env-close"]
        # the bound: MAX_LEFT_BEHIND, plus the calls of the step that reached it (they started before any timed out)
        assert len(hung) <= env_module.MAX_LEFT_BEHIND + len(rows), f"{len(hung)} hung close threads"
        assert any("not started" in r.getMessage() for r in caplog.records)
    finally:
        RELEASE.set()


def test_the_command_exits_whatever_threads_user_code_left_running():
    code = ("import sys, threading\n"
            "threading.Thread(target=threading.Event().wait, name='left-by-an-environment').start()\n"
            "sys.argv = ['grpoflow', 'config', 'trainer.total_steps=1']\n"
            "from grpoflow.cli import main\n"
            "sys.exit(main())\n")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("grpoflow kept running after its command ended: a non-daemon thread held it") from None
    assert done.returncode == 0, done.stderr
    assert "total_steps: 1" in done.stdout and "left-by-an-environment" in done.stderr

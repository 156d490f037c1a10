"""OpenEnv environments as rollout.multi_turn.env=openenv, against a real OpenEnv server (openenv-core's create_app,
served by uvicorn on 127.0.0.1 in its own process; tests/integration/openenv_server.py): the adapter's observations,
rewards and seeds, then the tiny model trained end to end through grpoflow's environment loop."""

import asyncio
import json
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv.core")

from grpoflow.config import ConfigError, load_config  # noqa: E402
from grpoflow.plan.checks import check_multi_turn  # noqa: E402
from grpoflow.controller.metrics import read_metrics  # noqa: E402
from grpoflow.commands.run import sft_stage, train  # noqa: E402
from grpoflow.trajectories.env import GuardedEnvironment, StepResult, load_env  # noqa: E402
from grpoflow.trajectories.openenv_env import observation_text  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def server_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "openenv_server:app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=HERE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError("the OpenEnv server exited") from None
                time.sleep(0.1)
        else:
            raise RuntimeError("the OpenEnv server did not start in 30 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_observation_text():
    assert observation_text({"text": "hi", "done": False, "reward": 0.0, "metadata": {}}) == "hi"
    assert observation_text({"a": "x", "b": 2, "done": False}) == '{"a": "x", "b": 2}'
    assert observation_text({"a": "x", "b": "y"}, "b") == "y"
    with pytest.raises(KeyError, match="observation_field"):
        observation_text({"a": "x"}, "c")


def test_the_adapter_plays_a_real_openenv_server(server_url):
    env = GuardedEnvironment(load_env("openenv"), {"url": server_url})
    secret = random.Random(7).randint(1, 8)  # the server's environment draws it from the seed it is reset with

    async def play():
        await env.start()
        assert await env.reset({}, seed=7) == [{"role": "user", "content": "Guess 1-8"}]
        wrong = 1 if secret != 1 else 2
        assert await env.step(f"{wrong}") == StepResult(
            [{"role": "user", "content": "higher" if wrong < secret else "lower"}], False, 0.0)
        assert await env.step(str(secret)) == StepResult([], True, 1.0)
        assert await env.reward() == {"env": 1.0} and env.failure is None
        await env.close()

    asyncio.run(play())


def test_a_missing_url_is_a_config_error_before_anything_starts():
    with pytest.raises(ConfigError, match="missing a required argument: 'url'"):
        check_multi_turn(load_config(None, ["rollout.multi_turn.env=openenv"]))
    with pytest.raises(ConfigError, match="rollout.multi_turn.env is not"):
        check_multi_turn(load_config(None, ["rollout.multi_turn.env_args={url: http://127.0.0.1:1}"]))
    check_multi_turn(load_config(None, ["rollout.multi_turn.env=openenv",
                                        "rollout.multi_turn.env_args={url: http://127.0.0.1:1}"]))
    env = GuardedEnvironment(load_env("openenv"), {"url": ""})
    asyncio.run(env.start())
    assert "rollout.multi_turn.env_args={url:" in env.failure


def test_grpoflow_trains_through_an_openenv_server(server_url, tmp_path):
    base = ["model.path=builtin:tiny-0.5m", "data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=64",
            "rollout.multi_turn.max_turns=3", "trainer.val_every=0", "trainer.save_every=0", "trainer.log_every=1",
            "trainer.resume=never", "trainer.log_train_groups=4"]
    # a warm start on the built-in guess-the-number demonstrations, so that the model plays several turns
    warm = sft_stage(load_config("guess_number", base + ["sft.steps=60", "sft.batch_size=16",
                                                         f"trainer.output_dir={tmp_path / 'warm'}"]))
    out = tmp_path / "run"
    train(load_config("guess_number", base + [f"model.path={warm}", "sft.steps=0", f"trainer.output_dir={out}",
                                              "rollout.multi_turn.env=openenv",
                                              f"rollout.multi_turn.env_args={{url: {server_url}}}",
                                              "reward.function=null", "trainer.total_steps=2"]))
    steps = [r for r in read_metrics(out) if "timing_s/step" in r]
    assert len(steps) == 2 and all(r.get("reward/env/errors", 0) == 0 for r in steps)
    assert max(r["multi_turn/turns/max"] for r in steps) >= 2
    groups = [json.loads(line) for line in (out / "train_samples.jsonl").read_text().splitlines()]
    samples = [s for g in groups for s in g["samples"]]
    replies = {m["content"] for s in samples for m in s["conversation"][1:] if m["role"] == "user"}
    assert replies and replies <= {"higher", "lower", "a number"}   # the server's observations, as user messages
    for s in samples:  # the OpenEnv reward is the only reward: 1 when the model's last turn found the number
        assert s["score"] == s["reward_parts"]["env"] in (0.0, 1.0)
        if s["score"] == 1.0:
            assert s["conversation"][-1]["role"] == "assistant"

"""The verifiers adapter's pure parts: the data spec, a finished verifiers episode as reward parts (hand values, on
the package's own Episode / Trace / Reward types), and the errors a user meets (a missing extra, misplaced
settings). The episodes themselves run in tests/integration/test_verifiers_run.py."""

import importlib.util
import sys

import pytest

from grpoflow.config import ConfigError
from grpoflow.plan.run_plan import read_rows
from grpoflow.trajectories.agents import load_agent
from grpoflow.trajectories.verifiers_agent import env_config_dict, episode_rewards
from grpoflow.tasks.verifiers_tasks import parse_spec


def test_the_spec_names_the_taskset_its_options_and_a_limit():
    assert parse_spec("verifiers:reverse_text") == ({"id": "reverse_text"}, None)
    assert parse_spec("verifiers:my_set?limit=8&num_tasks=100&task.tolerance=0.5&split=test") == (
        {"id": "my_set", "num_tasks": 100, "task": {"tolerance": 0.5}, "split": "test"}, 8)
    for bad in ("verifiers:", "verifiers:x?limit", "verifiers:x?limit=many"):
        with pytest.raises(ValueError, match="verifiers:"):
            parse_spec(bad)


def test_without_the_package_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)   # import verifiers raises ImportError
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(ValueError, match=r"pip install 'grpoflow\[verifiers\]'"):
        load_agent("verifiers", {})
    with pytest.raises(ConfigError, match=r"pip install 'grpoflow\[verifiers\]'"):
        read_rows(["verifiers:reverse_text"])


def test_agent_args_belong_to_built_in_agents(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text("async def run(row, client):\n    return 1.0\n")
    with pytest.raises(ValueError, match="leave rollout.agent.args empty"):
        load_agent(f"{agent}:run", {"agent": {}})


needs_verifiers = pytest.mark.skipif(importlib.util.find_spec("verifiers") is None,
                                     reason="verifiers is not installed (pip install 'grpoflow[verifiers]')")


def trace(name="agent", ok=True, errors=(), **rewards):
    import verifiers.v1 as vf

    return vf.Trace(task=vf.TraceTask(type="Task", data={"idx": 0, "prompt": "hi"}),
                    agent=vf.AgentInfo(config=vf.AgentConfig(), name=name), ok=ok, errors=list(errors),
                    rewards={k: None if v is None else vf.Reward(score=v[0], weight=v[1]) for k, v in rewards.items()})


def episode(*traces, ok=True, errors=()):
    import verifiers.v1 as vf

    return vf.Episode(task=vf.TraceTask(type="Task", data={"idx": 0, "prompt": "hi"}), traces=list(traces), ok=ok,
                      errors=list(errors))


@needs_verifiers
def test_an_episode_becomes_its_weighted_rewards():
    # score x weight per reward: 1 x 0.5 and 0.25 x 2; their sum is verifiers' own trace.reward (1.0)
    one = trace(exact=(1.0, 0.5), length=(0.25, 2.0))
    assert episode_rewards(episode(one)) == {"exact": 0.5, "length": 0.5} and one.reward == 1.0
    # a multi-agent episode: each agent's rewards under its name
    two = episode(trace("solver", exact=(1.0, 1.0)), trace("judge", agree=(0.5, 3.0)))
    assert episode_rewards(two) == {"solver/exact": 1.0, "judge/agree": 1.5}


@needs_verifiers
def test_a_failed_episode_raises_with_verifiers_error():
    import verifiers.v1 as vf

    crash = vf.Error(type="HarnessError", message="harness 'null' exited 1: boom")
    with pytest.raises(RuntimeError, match="HarnessError: harness 'null' exited 1: boom"):
        episode_rewards(episode(trace(ok=False, errors=[crash], exact=(0.0, 1.0)), ok=False))
    with pytest.raises(RuntimeError, match="TimeoutError: run"):
        episode_rewards(episode(ok=False, errors=[vf.Error(type="TimeoutError", message="run() exceeded")]))
    with pytest.raises(RuntimeError, match="did not score 'exact'"):
        episode_rewards(episode(trace(exact=None)))
    with pytest.raises(RuntimeError, match="@vf.reward"):
        episode_rewards(episode(trace()))


def test_seats_run_locally_unless_the_user_names_a_runtime():
    args = {"agent": {"harness": {"id": "null"}}, "judge": {"runtime": {"type": "docker"}}}
    assert env_config_dict(args, {"id": "t"}, ["agent", "judge", "solver"]) == {
        "taskset": {"id": "t"}, "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
        "judge": {"runtime": {"type": "docker"}}, "solver": {"runtime": {"type": "subprocess"}}}
    assert "runtime" not in args["agent"]   # the user's settings are not changed in place
    # `{harness: {id: null}}` typed on the command line: YAML's null is verifiers' null harness
    assert env_config_dict({"agent": {"harness": {"id": None}}}, {"id": "t"}, ["agent"])["agent"]["harness"] == \
        {"id": "null"}


@needs_verifiers
def test_the_taskset_comes_from_the_rows_not_the_agent_args():
    with pytest.raises(ValueError, match="data.train_files=\\[verifiers:TASKSET\\]"):
        load_agent("verifiers", {"taskset": {"id": "reverse_text"}})


@needs_verifiers
def test_without_uv_the_run_stops_at_start_saying_so(monkeypatch):
    import grpoflow.trajectories.verifiers_agent as adapter

    monkeypatch.setattr(adapter.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="uv, which is not on PATH"):
        load_agent("verifiers", {"agent": {"harness": {"id": "null"}}})
    load_agent("verifiers", {"agent": {"runtime": {"type": "docker"}}})   # a container brings its own uv

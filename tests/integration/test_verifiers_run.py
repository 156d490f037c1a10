"""verifiers environments as rollout.agent.program=verifiers, against the real `verifiers` package: its environment
runs its own rollout (verifiers' chat harness in a local subprocess, its interception server) against grpoflow's
OpenAI-compatible endpoint, and its rubric gives the reward. The environments are written with verifiers' own API:
vf_echo.py (single turn, two weighted rewards), vf_guess.py (a SingleAgentEnv answering every turn) and vf_calc.py
(a Toolset served over MCP that the harness calls).

First over a scripted engine (hand values: the rewards, the exact sampled ids, one sample per conversation, a tool
call parsed by the endpoint and run by verifiers), then
the tiny model trained end to end, single-turn and multi-turn. Skipped without verifiers (.ci/envs_stage installs
it with `grpoflow[verifiers]`); its harness programs run under uv, which the extra installs beside python."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from grpoflow.controller.metrics import read_metrics  # noqa: E402
from grpoflow.commands.run import sft_stage, train  # noqa: E402
from grpoflow.config import load_config  # noqa: E402
from grpoflow.data.dataset import PromptItem  # noqa: E402
from grpoflow.models.tiny import build_char_tokenizer  # noqa: E402
from grpoflow.trajectories.agents import AgentEpisodes, load_agent  # noqa: E402
from grpoflow.engines.protocol import SamplingParams  # noqa: E402
from grpoflow.tasks.verifiers_tasks import verifiers_rows  # noqa: E402
from scripted import ScriptedEngine, play, serving  # noqa: E402
from vf_echo import WORDS, letters  # noqa: E402
from vf_guess import hint  # noqa: E402

HERE = Path(__file__).parent
NULL_HARNESS = {"agent": {"harness": {"id": "null"}}}   # verifiers' plain chat loop (MCP tools only)
CALL = '<tool_call>{{"name": "calc_add", "arguments": {{"a": {}, "b": {}}}}}</tool_call>'


@pytest.fixture(scope="module", autouse=True)
def uv_on_path():
    """The harness programs run with uv: the one installed beside this python (the extra's), when not on PATH. The
    taskset modules here are importable by verifiers' tool-server processes too (an installed taskset package is)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
        if shutil.which("uv") is None:
            mp.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        if shutil.which("uv") is None:
            pytest.skip("uv is not installed (pip install 'grpoflow[verifiers]')")
        yield


def items(spec):
    return [PromptItem([], "", row, row["data_source"], index=i) for i, row in enumerate(verifiers_rows(spec))]


def opening(row):
    return row["prompt"]


def test_a_single_turn_episode_is_scored_by_the_rubric_and_trains_the_sampled_ids(monkeypatch):
    import verifiers.v1 as vf

    built = []
    load_environment = vf.load_environment
    monkeypatch.setattr(vf, "load_environment", lambda config: built.append(config) or load_environment(config))
    tok = build_char_tokenizer()
    engine = ScriptedEngine(tok, lambda text: "cat", None, version=2)
    with serving(engine, tok) as endpoint:
        agent = AgentEpisodes(load_agent("verifiers", NULL_HARNESS), endpoint, timeout_s=60, error_score=-1.0,
                              opening=opening)
        batch, metrics = play(agent, engine, items("verifiers:vf_echo?num_tasks=2"),
                              SamplingParams(n=2, max_new_tokens=40, temperature=1.0), 0, agent=True)
    r = endpoint.renderer
    # "cat" for "Say cat": all letters (1.0) + short (0.5 x 1); for "Say dog": no letter + short
    assert batch.env_rewards.tolist() == [1.5, 1.5, 0.5, 0.5]
    assert metrics["reward/agent/letters/mean"] == 0.5 and metrics["reward/agent/short/mean"] == 0.5
    assert metrics["agent/errors"] == 0 and metrics["agent/calls/mean"] == 1
    assert len(built) == 1   # one environment served the step's four episodes (VerifiersAgent.step_scope)
    assert batch.conversations[2] == [{"role": "user", "content": "Say dog"}, {"role": "assistant", "content": "cat"}]
    for k in range(4):   # the prompt verifiers' harness sent, rendered by grpoflow; the reply's ids as sampled
        prompt = batch.conversations[k][:1]
        ids = batch.input_ids[k][batch.attention_mask[k].bool()].tolist()
        assert ids == r.prompt_ids(prompt) + tok.encode("cat", add_special_tokens=False) + [r.turn.end_token_id]
        assert batch.response_mask[k].sum() == 4 and batch.policy_version[k] == 2


def test_a_multi_turn_environment_is_one_sample_with_its_user_turns_masked():
    tok = build_char_tokenizer()
    guesses = {0: "4", 1: "2", 2: "1", 3: "9"}      # by the number of user turns so far

    def policy(text):
        return guesses[text.count("<|im_start|>user") - 1]

    engine = ScriptedEngine(tok, policy, None)
    with serving(engine, tok) as endpoint:
        agent = AgentEpisodes(load_agent("verifiers", NULL_HARNESS), endpoint, timeout_s=60, error_score=-1.0,
                              opening=opening)
        batch, metrics = play(agent, engine, items("verifiers:vf_guess?limit=2"),
                              SamplingParams(n=1, max_new_tokens=200, temperature=1.0), 0, agent=True)
    # task 0 hides 1: 4 (lower), 2 (lower), 1 found -> 1.0; task 1 hides 6: 4 (higher), 2 (higher), 1 (higher), 9
    assert batch.env_rewards.tolist() == [1.0, 0.0]
    assert [[m["content"] for m in c] for c in batch.conversations] == [
        ["Guess 1-8", "4", "lower", "2", "lower", "1"],
        ["Guess 1-8", "4", "higher", "2", "higher", "1", "higher", "9"]]
    r = endpoint.renderer
    for k, turns in ((0, 3), (1, 4)):   # one sample per conversation: every reply trained, the user turns masked
        mask = batch.response_mask[k][batch.attention_mask[k].bool()[len(r.prompt_ids(
            batch.conversations[k][:1])):]]
        assert int(mask.sum()) == 2 * turns   # one digit and its end-of-turn token per reply
    assert metrics["agent/samples/mean"] == 1 and metrics["agent/errors"] == 0


def test_a_tool_call_runs_verifiers_mcp_tool_and_its_result_joins_the_sample_masked():
    tok = build_char_tokenizer()

    def policy(text):   # call calc_add on the question's numbers, then answer with the tool's result
        if "<|im_start|>tool" in text:
            return text.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0].strip()
        a, b = text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0].split("+")
        return CALL.format(int(a), int(b))

    engine = ScriptedEngine(tok, policy, None)
    with serving(engine, tok) as endpoint:
        agent = AgentEpisodes(load_agent("verifiers", NULL_HARNESS), endpoint, timeout_s=60, error_score=-1.0,
                              opening=opening)
        batch, metrics = play(agent, engine, items("verifiers:vf_calc?limit=2"),
                              SamplingParams(n=1, max_new_tokens=300, temperature=1.0), 0, agent=True)
    assert batch.env_rewards.tolist() == [1.0, 1.0] and metrics["agent/errors"] == 0
    call = CALL.format(1, 40)
    assert batch.conversations[1] == [{"role": "user", "content": "1+40"}, {"role": "assistant", "content": call},
                                      {"role": "tool", "content": "41", "name": "calc_add"},
                                      {"role": "assistant", "content": "41"}]
    # one sample: the call and the answer trained (each with its end-of-turn token), the tool's result masked
    assert metrics["agent/samples/mean"] == 1 and batch.response_mask[1].sum() == len(call) + 1 + 2 + 1


def test_grpoflow_trains_the_tiny_model_on_a_verifiers_taskset(tmp_path):
    # the override as docs/environments.md writes it (YAML reads the harness id `null` as None: the null harness)
    out = tmp_path / "run"
    train(load_config(None, ["model.path=builtin:tiny-0.5m", "data.train_files=[verifiers:vf_echo]",
                             "data.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=12",
                             "rollout.agent.program=verifiers", "rollout.agent.args={agent: {harness: {id: null}}}",
                             "reward.function=null", "sft.steps=0", "trainer.total_steps=2", "trainer.val_every=0",
                             "trainer.save_every=0", "trainer.log_every=1", "trainer.resume=never",
                             "trainer.log_train_groups=2", f"trainer.output_dir={out}"]))
    steps = [r for r in read_metrics(out) if "timing_s/step" in r]
    assert len(steps) == 2 and all(r["agent/errors"] == 0 and "reward/agent/letters/mean" in r for r in steps)
    groups = [json.loads(line) for line in (out / "train_samples.jsonl").read_text().splitlines()]
    samples = [s for g in groups for s in g["samples"]]
    assert len(samples) == 16
    for s in samples:   # the rubric's reward, recomputed from the sample's own conversation
        user, reply = s["conversation"][0]["content"], s["conversation"][-1]["content"].strip()
        word = user.removeprefix("Say ")
        assert word in WORDS
        assert s["score"] == pytest.approx(letters(word, reply) + 0.5 * (len(reply) <= 8))


def test_grpoflow_trains_through_a_multi_turn_verifiers_environment(tmp_path):
    base = ["model.path=builtin:tiny-0.5m", "data.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=128",
            "rollout.multi_turn.max_turns=4", "trainer.val_every=0", "trainer.save_every=0", "trainer.log_every=1",
            "trainer.resume=never", "trainer.log_train_groups=2"]
    # a warm start on the built-in guess-the-number demonstrations, so that the model plays several turns
    warm = sft_stage(load_config("guess_number", base + ["sft.steps=60", "sft.batch_size=16",
                                                         f"trainer.output_dir={tmp_path / 'warm'}"]))
    out = tmp_path / "run"
    train(load_config(None, base + [f"model.path={warm}", "sft.steps=0", f"trainer.output_dir={out}",
                                    "data.train_files=[verifiers:vf_guess]", "rollout.agent.program=verifiers",
                                    f"rollout.agent.args={json.dumps(NULL_HARNESS)}", "reward.function=null",
                                    "trainer.total_steps=1"]))   # a step: 8 episodes of up to 4 turns, ~40 s
    steps = [r for r in read_metrics(out) if "timing_s/step" in r]
    # four turns fit the 128-token budget: every episode is one sample, the environment's turns inside it
    assert len(steps) == 1 and all(r["agent/errors"] == 0 and r["agent/samples/mean"] == 1 for r in steps)
    assert max(r["multi_turn/turns/max"] for r in steps) >= 2
    groups = [json.loads(line) for line in (out / "train_samples.jsonl").read_text().splitlines()]
    replies = set()
    for g in groups:
        index = int(g["row"]["task"].removeprefix("vf_guess/"))
        secret = 1 + 5 * index % 8   # vf_guess's task i hides 1 + 5i mod 8
        for s in g["samples"]:
            conversation = s["conversation"]
            replies |= {m["content"] for m in conversation[1:] if m["role"] == "user"}
            guesses = [m["content"] for m in conversation if m["role"] == "assistant"]
            # the rubric's `found`, recomputed: 1 when a reply named the secret (then the environment stopped)
            found = any(hint(text, secret) is None for text in guesses)
            assert s["score"] == float(found) and (not found or conversation[-1]["role"] == "assistant")
    assert replies and replies <= {"higher", "lower", "a number"}   # the environment's turns, as user messages

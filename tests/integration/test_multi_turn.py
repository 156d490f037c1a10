"""Multi-turn RL end to end on the tiny model: trained ids are the sampled ids plus the rendered environment ids
(and the sampling log-probs are the teacher-forced ones), a run logs its turns and conversations, the ray backend
(split placement, async) gives the local backend's first step, and SIGKILL + resume equals the uninterrupted run."""

import json
import random
import re
import shutil
from pathlib import Path

import pytest
import torch

from grpoflow.config import load_config
from grpoflow.controller.checkpoint import CheckpointManager
from grpoflow.controller.metrics import read_metrics
from grpoflow.commands.run import sft_stage, train
from grpoflow.data.dataset import PromptItem
from grpoflow.models.loading import load_causal_lm
from grpoflow.models.logprobs import response_log_probs
from grpoflow.trajectories.chat import ChatRenderer, TemplateError
from grpoflow.trajectories.env import GuessNumber
from grpoflow.controller.rollouts import metrics_of
from grpoflow.data.tool_format import HERMES
from grpoflow.trajectories.loop import EnvLoop, RolloutItem
from grpoflow.trajectories.rollout import run_rollout
from grpoflow.trajectories.turns import stream_seed
from grpoflow.engines.protocol import SamplingParams
from grpoflow.workers.rollout import RolloutWorker
from kills import comparable, kill_at_step, train_process
from recording import Recording

DRAW_TOOL = f"{Path(__file__).with_name('sandboxed_draw_calculator.py')}:calculator"
BASE = ["model.path=builtin:tiny-0.5m", "data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=64",
        "rollout.multi_turn.max_turns=3", "trainer.val_every=0", "trainer.save_every=0", "trainer.log_every=1",
        "trainer.resume=never", "resources.cpus_per_rank=0.5"]


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory) -> str:
    """The tiny model warm-started on guess-the-number demonstration conversations (so it ends its turns)."""
    run = tmp_path_factory.mktemp("warm")
    return sft_stage(load_config("guess_number", BASE + ["sft.steps=60", "sft.batch_size=16",
                                                         f"trainer.output_dir={run}"]))


def run(out, warm_model, *overrides):
    train(load_config("guess_number", BASE + [f"model.path={warm_model}", "sft.steps=0", f"trainer.output_dir={out}",
                                              *overrides]))
    return [r for r in read_metrics(out) if "timing_s/step" in r]


def play_env(worker, engine, items, params, seed, max_turns=4):
    loop = EnvLoop(ChatRenderer(worker.tokenizer), env_cls=GuessNumber, tools=None, max_turns=max_turns,
                   opening=lambda row: [{"role": "user", "content": "Guess 1-8"}])
    requests = [RolloutItem(it.prompt_ids, it.index, k, it.row) for k, it in enumerate(items)]
    batch = run_rollout(loop, engine, requests, params, seed, decode=worker.tokenizer.decode)
    return batch, metrics_of(batch, True, False, episodes=len(items) * params.n)


def test_trained_ids_are_the_sampled_ids_and_the_rendered_environment_ids(warm_model):
    worker = RolloutWorker(0, 1, model_path=warm_model)
    renderer = ChatRenderer(worker.tokenizer)
    engine = Recording(worker.engine)
    items = [PromptItem([], "", {"secret": s}, "g", index=i) for i, s in enumerate((2, 5, 8))]  # trajectory = i*n+j
    batch, metrics = play_env(worker, engine, items, SamplingParams(n=4, max_new_tokens=96, temperature=1.0), 3)
    sampled = {(i * 4 + j, t): engine.sampled[stream_seed(3, i, 4, j, t)][:2]
               for i in range(3) for j in range(4) for t in range(4) if stream_seed(3, i, 4, j, t) in engine.sampled}
    assert metrics["multi_turn/prefilled_tokens"] < sum(len(p) for p, _, _ in engine.sampled.values()), \
        "later turns should reuse their trajectory's KV cache"
    assert metrics["multi_turn/turns/max"] >= 2, "the warm-started model should play several turns"
    for row in range(len(batch)):
        prompt = batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist()
        response = batch.response_ids[row][batch.response_attention[row].bool()].tolist()
        mask = batch.response_mask[row][batch.response_attention[row].bool()].tolist()
        # Rebuild the trajectory from the engine's outputs and the renderer alone.
        expected, expected_mask, prefix, conversation = [], [], list(prompt), batch.conversations[row]
        assistant_turns = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
        for n, at in enumerate(assistant_turns):
            given, ids = sampled[row, n]
            assert given == prefix   # the engine continued exactly the trajectory so far
            ids = ids[:96 - len(expected)]
            expected += ids
            expected_mask += [1] * len(ids)
            if n + 1 < len(assistant_turns):
                env = renderer.continuation_ids(conversation[:at + 1], conversation[at + 1:assistant_turns[n + 1]])
                expected += env
                expected_mask += [0] * len(env)
            prefix = prompt + expected
        assert response == expected, (row, response, expected, conversation)
        assert mask == expected_mask
    # The sampling log-probs are what the model gives the whole trajectory, teacher-forced.
    model = load_causal_lm(warm_model)
    with torch.no_grad():
        forced, _ = response_log_probs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                       batch.response_attention)
    on = batch.response_mask.bool()
    assert torch.allclose(forced[on], batch.rollout_log_probs[on], atol=2e-4)


def test_a_run_logs_turns_and_whole_conversations(tmp_path, warm_model):
    records = run(tmp_path, warm_model, "trainer.total_steps=2", "trainer.val_every=2", "data.val_max_prompts=8",
                  "trainer.log_samples=3")
    for key in ("multi_turn/turns/mean", "multi_turn/turns/max", "multi_turn/env_token_share",
                "multi_turn/budget_truncated", "tools/calls", "reward/env/mean", "critic/score/mean",
                "val/mean@4"):
        assert key in records[-1], key
    last = records[-1]  # validation's conversations: model turns (1..max_turns=4) and tool calls per trajectory
    assert 1 <= last["val/turns"] <= 4 and last["val/tool_calls"] == 0
    assert last["val/guess_number/turns"] == last["val/turns"]
    samples = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert samples and all(s["conversation"][0] == {"role": "user", "content": "Guess 1-8"} for s in samples)
    assert all(s["conversation"][1]["role"] == "assistant" for s in samples)
    # the training groups: whole conversations, and the response split into the model's (trained) tokens and the
    # environment's (not trained)
    groups = [json.loads(line) for line in open(tmp_path / "train_samples.jsonl")]
    assert [g["step"] for g in groups] == [1] * 4 + [2] * 4 and all(len(g["samples"]) == 4 for g in groups)
    trained = [s for g in groups for s in g["samples"]]
    assert all(s["conversation"][0] == {"role": "user", "content": "Guess 1-8"} for s in trained)
    replied = [s for s in trained if len(s["conversation"]) > 2]
    assert replied and all({(seg["source"], seg["trained"]) for seg in s["segments"]} >= {("model", True),
                                                                                      ("env", False)}
                           for s in replied)
    assert all("env" in s["reward_parts"] for s in trained)


def test_a_system_prompt_opens_the_conversations_of_plain_string_prompts(tmp_path, warm_model):
    # the guess-number rows' prompts are plain strings; data.apply_chat_template is left unset
    run(tmp_path, warm_model, "trainer.total_steps=1", "data.system_prompt=Answer with one number.",
        "trainer.val_every=1", "data.val_max_prompts=4", "trainer.log_samples=2")
    samples = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert samples and all(s["conversation"][:2] == [{"role": "system", "content": "Answer with one number."},
                                                     {"role": "user", "content": "Guess 1-8"}] for s in samples)


@pytest.fixture(scope="module")
def calculator_model(tmp_path_factory) -> str:
    """The tiny model warm-started on the calculator demonstrations (tasks/multi_turn.py; half of them call the
    tool), as the calculator_tool recipe does before GRPO: a short, hot warm start that writes calls."""
    run = tmp_path_factory.mktemp("calculator")
    return sft_stage(load_config("calculator_tool", BASE + ["model.path=builtin:tiny-0.5m", "sft.steps=60",
                                                            "sft.batch_size=16", "sft.lr=3e-3",
                                                            f"trainer.output_dir={run}"]))


def test_tools_run_in_a_training_step(tmp_path, calculator_model):
    train(load_config("calculator_tool", BASE + [f"model.path={calculator_model}", "sft.steps=0", "data.val_files=[]",
                                                 "data.prompts_per_step=8", "rollout.max_new_tokens=160",
                                                 "rollout.multi_turn.max_turns=2", "trainer.total_steps=1",
                                                 "trainer.log_train_groups=8", f"trainer.output_dir={tmp_path}"]))
    row = [r for r in read_metrics(tmp_path) if "timing_s/step" in r][0]
    assert row["tools/calls"] > row["tools/errors"], row   # at least one call parsed and ran
    # the calculator's results joined the conversations: each well-formed call's tool message is the product
    ran = []
    for group in map(json.loads, open(tmp_path / "train_samples.jsonl")):
        for sample in group["samples"]:
            conversation = sample["conversation"]
            for said, reply in zip(conversation, conversation[1:]):
                calls = HERMES.parse(said["content"]).calls if said["role"] == "assistant" else []
                expression = calls[0].arguments.get("expression", "") if calls else ""
                if re.fullmatch(r"\d+\*\d+", expression):
                    assert reply["role"] == "tool" and reply["content"] == str(eval(expression)), (said, reply)
                    ran.append(expression)
    assert ran


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_ray_split_async_gives_the_local_first_step(tmp_path, warm_model):
    keys = ["critic/score/mean", "multi_turn/turns/mean", "multi_turn/env_token_share", "actor/pg_loss",
            "actor/grad_norm"]
    local = run(tmp_path / "local", warm_model, "trainer.total_steps=1")
    ray = run(tmp_path / "ray", warm_model, "trainer.total_steps=2", "backend=ray", "placement=split",
              "trainer.mode=async", "rollout.max_staleness=1")
    for k in keys:
        assert abs(local[0][k] - ray[0][k]) <= 1e-5 * max(1.0, abs(local[0][k])), (k, local[0][k], ray[0][k])
    assert [r["async/staleness/max"] for r in ray] == [0, 1]


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_equals_the_uninterrupted_run(tmp_path, warm_model):
    args = BASE + [f"model.path={warm_model}", "sft.steps=0", "trainer.total_steps=5", "trainer.save_every=1",
                   "trainer.keep_last=0", "trainer.resume=auto", "algorithm.use_kl_in_reward=true"]
    full, out, _ = uninterrupted_and_resumed("guess_number", args, tmp_path)
    assert comparable(out) == comparable(full)


def uninterrupted_and_resumed(recipe: str, args: list[str], tmp_path) -> tuple:
    """(the uninterrupted run's folder, the folder of a run SIGKILLed after step 2 or 3 and resumed, the last step
    the killed run saved): the recipe's two runs of 5 steps with `args` (checkpoints every step)."""
    full = tmp_path / "full"
    train(load_config(recipe, args + [f"trainer.output_dir={full}"]))
    out = tmp_path / "killed"
    proc = train_process([recipe, *args, f"trainer.output_dir={out}"],
                         threads=torch.get_num_threads())  # the same float sums as the in-process run
    kill_at_step(proc, out, random.Random().randint(2, 3))
    latest = CheckpointManager(out).latest()
    assert latest is not None
    killed_at = int(latest.name.split("_")[-1])  # step_000002: the resumed run goes on from step 3
    print(f"killed after step {killed_at}")
    assert killed_at < 5, "the SIGKILL came after the run's last step: nothing was resumed"
    train(load_config(recipe, args + [f"trainer.output_dir={out}"]))
    return full, out, killed_at


def test_a_template_that_is_not_prefix_preserving_stops_the_run_before_the_warm_start(tmp_path, tiny_model_path):
    from transformers import AutoTokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_model_path, model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = ("{% for m in messages %}{% set c = m['content'] %}"
                         "{% if m['role'] == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1] %}"
                         "{% endif %}{{ '<|im_start|>' + m['role'] + '\n' + c + '<|im_end|>\n' }}{% endfor %}"
                         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    tok.save_pretrained(model)
    with pytest.raises(TemplateError, match="not prefix-preserving"):
        train(load_config("guess_number", BASE + [f"model.path={model}", "sft.steps=5",
                                                  f"trainer.output_dir={tmp_path / 'run'}"]))
    assert not (tmp_path / "run" / "sft_model").exists()


def test_eval_scores_a_multi_turn_model_with_its_environment_as_validation_does(tmp_path, warm_model):
    from grpoflow.commands.evaluate import evaluate
    greedy = ["rollout.val_temperature=0", "rollout.val_n=1", "data.val_max_prompts=8"]
    records = run(tmp_path, warm_model, "trainer.total_steps=1", "trainer.val_every=1", *greedy)
    (before,) = [r for r in read_metrics(tmp_path) if r["step"] == 0 and "val/mean@1" in r]
    metrics = evaluate(load_config("guess_number", BASE + [f"model.path={warm_model}", *greedy]))
    assert records and metrics["val/mean@1"] == before["val/mean@1"]


def tool_replies(run_dir: Path) -> list[tuple[int, str]]:
    """(step, content) of the tool messages of the run's logged training groups."""
    return [(group["step"], m["content"]) for group in map(json.loads, open(run_dir / "train_samples.jsonl"))
            for s in group["samples"] for m in s["conversation"] if m["role"] == "tool"]


@pytest.mark.slow
def test_sigkill_mid_tool_run_then_resume_equals_the_uninterrupted_run(tmp_path, calculator_model):
    """Issue 36: SIGKILL + resume of a run whose model calls a sandboxed tool equals the uninterrupted run. The tool
    (sandboxed_draw_calculator.py) answers with a draw from `random` and a count of the calls its process served, so
    the equality holds only if every call runs in a fresh child seeded from the call alone (user_code_child.py's
    fork server), the same after a restart as before it."""
    args = BASE + [f"model.path={calculator_model}", "sft.steps=0", f"rollout.multi_turn.tools=[{DRAW_TOOL}]",
                   "rollout.max_new_tokens=160", "rollout.multi_turn.max_turns=2", "data.val_files=[]",
                   "trainer.total_steps=5", "trainer.save_every=1", "trainer.keep_last=0", "trainer.resume=auto",
                   "trainer.log_train_groups=4"]
    full, out, killed_at = uninterrupted_and_resumed("calculator_tool", args, tmp_path)
    records = comparable(full)
    assert comparable(out) == records
    # not a vacuous equality: the sandboxed tool really ran and answered, in the resumed steps too
    resumed = [r for r in records if "tools/calls" in r and r["step"] > killed_at]
    assert sum(r["tools/calls"] - r["tools/errors"] for r in resumed) > 0, records
    replies = tool_replies(full)
    assert [s for s, _ in replies if s > killed_at], (killed_at, replies)
    assert all(" ~" in reply and reply.endswith(" #1") for _, reply in replies if "#" in reply), replies

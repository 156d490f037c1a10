"""rollout.partial for conversations (trajectories/loop.py EnvLoop, resumed) on the tiny model warm-started on the
guess_number and calculator_tool demonstrations: conversations paused anywhere (mid-turn, after tool calls) and
continued with the same weights are the uninterrupted ones; continued with new weights, their log-probs are the
teacher-forced ones under the weights that sampled each token; an environment whose replies use an unseeded random
stops with the error that says so; two training runs give identical metrics, and a run SIGKILLed with paused
conversations in its checkpoint and resumed equals the uninterrupted one."""

import copy
import random
from pathlib import Path

import pytest
import torch

from grpoflow.commands.run import sft_stage
from grpoflow.config import load_config
from grpoflow.controller.checkpoint import CheckpointManager, load_state
from grpoflow.errors import UserError
from grpoflow.models.loading import load_causal_lm, load_tokenizer
from grpoflow.trajectories.loop import RolloutItem
from grpoflow.data.batch import Batch
from grpoflow.trajectories.rollout import run_rollout
from grpoflow.trajectories.trajectory import Trajectory
from grpoflow.engines.hf import HFRolloutEngine
from grpoflow.engines.protocol import SamplingParams
from grpoflow.tasks.multi_turn import calculator_splits, guess_number_splits
from grpoflow.plan.checks import check_config
from grpoflow.workers.rollout_kinds import build_env_loop
from kills import comparable, kill_at_step, train_process, train_to_end

BASE = ["model.path=builtin:tiny-0.5m", "data.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=64",
        "rollout.multi_turn.max_turns=3", "trainer.val_every=0", "trainer.save_every=0", "trainer.log_every=1",
        "trainer.resume=never"]
SEED = 11


@pytest.fixture(scope="module")
def guess_model(tmp_path_factory) -> str:
    """The tiny model warm-started on guess-the-number conversations (it ends its turns and guesses again)."""
    run = tmp_path_factory.mktemp("guess")
    return sft_stage(load_config("guess_number", BASE + ["sft.steps=60", "sft.batch_size=16",
                                                         f"trainer.output_dir={run}"]))


@pytest.fixture(scope="module")
def calculator_model(tmp_path_factory) -> str:
    """The tiny model warm-started on the calculator demonstrations (half of them call the tool)."""
    run = tmp_path_factory.mktemp("calculator")
    return sft_stage(load_config("calculator_tool", BASE + ["sft.steps=60", "sft.batch_size=16", "sft.lr=3e-3",
                                                            f"trainer.output_dir={run}"]))


def engine_of(model_path):
    tok = load_tokenizer(model_path)
    return HFRolloutEngine(load_causal_lm(model_path).eval(), pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id), tok


def requests(rows, tok):
    return [RolloutItem(tok.encode(str(r["prompt"]), add_special_tokens=False), i, i, r) for i, r in enumerate(rows)]


def fresh(items, n):
    """Every item's n samples, none begun (as the controller's pool holds a new group)."""
    return [[None] * n for _ in items]


def carried(items, samples):
    return [RolloutItem(it.ids, it.index, it.position, it.row, seed=SEED,
                        carried=[s if isinstance(s, Trajectory) else None for s in samples[k]],
                        finished=tuple(j for j, s in enumerate(samples[k]) if isinstance(s, Batch)))
            for k, it in enumerate(items)]


def play_partial(loop, engine, tok, items, params, samples, quota):
    """One partial rollout of every item from `samples` (per item and sample: None not begun, a paused trajectory,
    or the row of a finished one), pausing once `quota` groups are complete: the samples after it, per item."""
    batch = run_rollout(loop, engine, carried(items, samples), params, None, quota=quota,
                        pad_token_id=tok.pad_token_id)
    samples = [list(s) for s in samples]
    for r, c in enumerate(batch.carried):
        samples[int(batch.group_ids[r])][c.episode % params.n] = c.trajectory if c.paused else batch.select([r])
    return samples


def as_batch(samples, tok):
    """The finished samples' rows, prompt-major, as one batch (as the controller's PartialQueue trains them)."""
    return Batch.concat([s for ss in samples for s in ss], pad_token_id=tok.pad_token_id).trimmed()


def paused_mid_conversation(samples):
    """Paused samples that had finished at least one model turn (so continuing them replays the environment)."""
    return [s for ss in samples for s in ss if isinstance(s, Trajectory) and s.turns >= 1]


def paused_then_finished(loop, engine, tok, items, params, quotas):
    """Every item's samples from the start (seed SEED), over partial rollouts that pause once quotas[i] groups are
    complete, until all are: (the samples paused mid-conversation on the way, the final batch)."""
    samples = fresh(items, params.n)
    paused = []
    for quota in quotas + [len(items)]:
        samples = play_partial(loop, engine, tok, items, params, samples, quota)
        paused += copy.deepcopy(paused_mid_conversation(samples))
    assert all(isinstance(s, Batch) for ss in samples for s in ss)
    return paused, as_batch(samples, tok)


def assert_same_samples(a, b):
    assert a.response_ids.tolist() == b.response_ids.tolist()
    assert a.response_mask.tolist() == b.response_mask.tolist()
    assert a.response_attention.tolist() == b.response_attention.tolist()
    torch.testing.assert_close(a.rollout_log_probs, b.rollout_log_probs, atol=2e-5, rtol=0)
    assert a.env_rewards.tolist() == b.env_rewards.tolist() and a.truncated.tolist() == b.truncated.tolist()
    assert a.conversations == b.conversations


def env_loop(cfg, tokenizer):
    """The environment loop of `cfg`, from its resolved parts (as a rollout worker builds it)."""
    return build_env_loop(cfg, tokenizer, check_config(cfg))


PARAMS = SamplingParams(n=4, max_new_tokens=64, temperature=1.0)
SCHEDULES = [[1], [2, 4], [3, 5]]  # the rollouts pause once this many groups are complete, then play to the end


def test_guess_number_conversations_paused_and_continued_are_the_uninterrupted_ones(guess_model):
    engine, tok = engine_of(guess_model)
    loop = env_loop(load_config("guess_number", BASE), tok)
    items = requests(guess_number_splits()[0][:6], tok)
    whole = run_rollout(loop, engine, items, PARAMS, SEED, pad_token_id=tok.pad_token_id)
    mid = []
    for quotas in SCHEDULES:  # pauses at different points
        paused, continued = paused_then_finished(loop, engine, tok, items, PARAMS, quotas)
        mid += paused
        assert_same_samples(continued, whole)
    assert any(p.open.ids for p in mid), "no conversation paused mid-way with tokens of its open turn"
    assert whole.env_rewards.sum() > 0  # the environment's rewards took part


def test_calculator_conversations_paused_after_their_tool_calls_are_the_uninterrupted_ones(calculator_model):
    engine, tok = engine_of(calculator_model)
    loop = env_loop(load_config("calculator_tool", BASE + ["rollout.multi_turn.max_turns=2",
                                                                 "rollout.max_new_tokens=160"]), tok)
    params = SamplingParams(n=4, max_new_tokens=160, temperature=1.0)
    items = requests(calculator_splits()[0][:6], tok)
    after_calls = []
    try:
        whole = run_rollout(loop, engine, items, params, SEED, pad_token_id=tok.pad_token_id)
        for quotas in SCHEDULES:
            paused, continued = paused_then_finished(loop, engine, tok, items, params, quotas)
            after_calls += [p for p in paused if p.tool_calls > 0]
            assert_same_samples(continued, whole)
            assert [i.tool_calls for i in continued.infos] == [i.tool_calls for i in whole.infos]
    finally:
        loop.close()
    assert after_calls, "no conversation paused after a tool call"


@torch.no_grad()
def forced(model, prompt, response):
    """[R] log-probs of `response` after `prompt` under `model`, teacher-forced."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1:-1]
    return lp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_continued_log_probs_are_those_of_the_weights_that_sampled_each_token(guess_model):
    engine, tok = engine_of(guess_model)
    loop = env_loop(load_config("guess_number", BASE), tok)
    items = requests(guess_number_splits()[0][:6], tok)
    old = load_causal_lm(guess_model).eval()
    new = copy.deepcopy(old)
    for p in new.parameters():
        p.data.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    samples = play_partial(loop, engine, tok, items, PARAMS, fresh(items, 4), 1)
    assert paused_mid_conversation(samples)
    engine.update_weights(new.named_parameters(), version=1)
    samples = play_partial(loop, engine, tok, items, PARAMS, samples, len(items))
    spanning = 0
    for ps in samples:
        for row in ps:  # each finished sample's row, as the worker rendered it
            prompt = row.prompt_ids[0][row.prompt_mask[0].bool()].tolist()
            width = int(row.response_attention[0].sum())
            response = row.response_ids[0, :width].tolist()
            v = torch.where(row.response_mask[0, :width].bool(), row.token_versions[0, :width], -1)
            recorded = row.rollout_log_probs[0, :width]
            expected = torch.where(v == 0, forced(old, prompt, response), forced(new, prompt, response))
            model = v >= 0
            torch.testing.assert_close(recorded[model], expected[model], atol=2e-5, rtol=0)
            spanning += bool((v == 0).any() and (v == 1).any())
            if (v == 1).any():  # the new weights differ enough for the test to tell them apart
                assert (forced(old, prompt, response)[v == 1] - expected[v == 1]).abs().max() > 1e-3
    assert spanning, "no conversation spans both versions"


class Moody:
    """A game whose replies carry an unseeded random number, so they are not a function of the row, the seed and the
    model's turns. The row says how long it runs: a `short` game ends after the model's first answer, a long one goes
    on to rollout.multi_turn.max_turns whatever the model says. So when the short groups are complete, the long
    conversations are past their first model turn, paused with a reply to replay."""

    def reset(self, *, seed, short=False, **_):
        self.short = short
        return "Guess 1-8"

    def step(self, assistant_text):
        if self.short:
            return None, True, 0.0
        return f"lower {random.randint(0, 10**9)}", False, 0.0


def test_an_environment_whose_replies_are_not_replayable_stops_with_the_reason(guess_model):
    engine, tok = engine_of(guess_model)
    loop = env_loop(load_config("guess_number", BASE), tok)
    loop.env_cls = Moody
    rows = [{**row, "short": k < 3} for k, row in enumerate(guess_number_splits()[0][:6])]
    items = requests(rows, tok)
    for quota in (3, 1, 2, 4, 5):  # 3: the short groups; the others in case some long sample spent its budget
        samples = play_partial(loop, engine, tok, items, PARAMS, fresh(items, 4), quota)
        if paused_mid_conversation(samples):
            break
    assert paused_mid_conversation(samples), "no conversation paused mid-way"
    with pytest.raises(UserError, match=r"Moody answered model turn 1 differently from the recorded reply: "
                                        r"rollout.partial needs environments and tools whose replies depend only on "
                                        r"the row, the seed and the model's turns"):
        play_partial(loop, engine, tok, items, PARAMS, samples, len(items))


# ---------------------------------------------------------------- whole runs

# guess_number's warm start, then games of which one in two runs to max_turns (the bench's skewed environment, given
# long_share 0.5): long conversations are still going when a step's groups are complete, so every step carries
# paused ones
SKEWED = Path(__file__).parents[2] / "bench" / "skewed_env.py"
RUN = ["model.path=builtin:tiny-0.5m", "sft.steps=60", "sft.batch_size=16", "data.prompts_per_step=4", "rollout.n=4",
       f"rollout.multi_turn.env={SKEWED}:SkewedTurns", "rollout.multi_turn.env_args={long_share: 0.5}",
       "rollout.max_new_tokens=160",
       "rollout.multi_turn.max_turns=6", "trainer.total_steps=5", "trainer.save_every=1", "trainer.keep_last=0",
       "trainer.val_every=0", "trainer.log_every=1", "rollout.partial.enable=true", "rollout.partial.oversample=2",
       "rollout.partial.max_staleness=2"]


def start(out):
    """A guess_number run as its own one-thread process (every run of this file compares in one setting)."""
    return train_process(["guess_number", f"trainer.output_dir={out}", *RUN])


def run(out):
    train_to_end(["guess_number", f"trainer.output_dir={out}", *RUN], timeout_s=600)
    return comparable(out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    return out, run(out)


@pytest.mark.slow  # three training processes
def test_partial_conversation_runs_carry_samples_across_versions_and_repeat_exactly(uninterrupted, tmp_path):
    _, metrics = uninterrupted
    steps = [m for m in metrics if "rollout/partial/staleness/max" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5]
    assert any(m["rollout/partial/multi_version_frac"] > 0 for m in steps)
    assert all(m["rollout/partial/carried_samples"] > 0 for m in steps)  # so every checkpoint holds paused ones
    assert 1 <= max(m["rollout/partial/staleness/max"] for m in steps) <= 2
    assert all("multi_turn/turns/mean" in m and "reward/env/mean" in m for m in steps)
    assert "actor/rollout_is/mean" in steps[0]
    assert run(tmp_path) == metrics


@pytest.mark.slow  # three training processes
def test_sigkill_then_resume_with_paused_conversations_equals_uninterrupted(uninterrupted, tmp_path):
    proc = start(tmp_path)
    kill_at_step(proc, tmp_path, random.Random().randint(2, 4))
    latest = CheckpointManager(tmp_path).latest()
    assert latest is not None, "no checkpoint was written before the kill"
    pool = load_state(latest / "controller.pt")["in_flight"]["partial_pool"]
    paused = [p for g in pool for p in g["samples"] if p is not None and "trajectory" in p]
    assert paused, "the checkpoint holds no paused conversation"
    assert run(tmp_path) == uninterrupted[1]  # trainer.resume=auto

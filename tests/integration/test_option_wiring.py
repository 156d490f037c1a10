"""Each algorithm option reaches what it changes: the controller's `compute_advantages` and `generate_and_score`
on hand-made batches, with a scripted rollout worker on the local pool, against hand-computed values.

The controller is the real one (its roles built on the tiny model in this process); only the rollout rank's
worker is replaced by `ScriptedRollout`, which returns fixed completions, so rewards, dynamic sampling, shaping,
KL in the reward and the estimators run as in a run. The end-to-end runs of the same options are the smoke
tests of test_algorithm_options.py.
"""

import math

import pytest
import torch

from grpoflow.algorithms import POLICY_LOSSES
from grpoflow.config import load_config
from plans import plan_of
from grpoflow.controller.trainer import Controller
from grpoflow.data.batch import Batch
from grpoflow.data.dataset import PromptItem
from grpoflow.trajectories.turns import SampleInfo
from grpoflow.training.timing import StageTimer

ITEMS = [PromptItem([40, 41], f"{a}+{b}=", {"answer": str(a + b)}, "addition", index=i)
         for i, (a, b) in enumerate([(1, 2), (3, 4), (5, 6), (7, 8)])]


@pytest.fixture
def build(tmp_path, tiny_model_path):
    made = []

    def controller(*overrides: str) -> Controller:
        cfg = load_config(None, [f"model.path={tiny_model_path}", f"trainer.output_dir={tmp_path}",
                                 "data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
                                 "reward.function=exact_match", "trainer.val_every=0", *overrides])
        # as `grpoflow train` does: the Controller takes a plan, checked
        made.append(Controller(plan_of(cfg, model_path=tiny_model_path, train_items=ITEMS, run_dir=tmp_path)))
        return made[-1]

    yield controller
    for c in made:
        c.close()


# -- compute_advantages: two groups of two samples, responses of 3, 2, 1 and 3 tokens ----------------------------

MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
SCORES = torch.tensor([1.0, 0.0, 0.5, 0.25])


def scored(**fields) -> Batch:
    return Batch(prompt_ids=torch.ones(4, 2, dtype=torch.long), prompt_mask=torch.ones(4, 2, dtype=torch.long),
                 response_ids=torch.ones(4, 3, dtype=torch.long), response_mask=MASK.clone(),
                 group_ids=torch.tensor([0, 0, 1, 1]), scores=SCORES.clone(),
                 truncated=fields.pop("truncated", torch.zeros(4, dtype=torch.bool)), **fields)


def close(tensor, expected):
    torch.testing.assert_close(tensor, torch.tensor(expected), rtol=0, atol=1e-6)


def per_sample(advantages):
    """[B] the advantage of each sample's first token (outcome estimators give every token the same)."""
    return advantages[:, 0].tolist()


def test_grpo_normalises_by_the_group_std_and_dr_grpo_does_not(build):
    # group 0: scores 1, 0 -> mean 0.5, unbiased std 0.7071; group 1: 0.5, 0.25 -> mean 0.375, std 0.1768
    out = build().compute_advantages(scored(), {})
    assert per_sample(out.advantages) == pytest.approx([0.7071, -0.7071, 0.7071, -0.7071], abs=1e-3)
    assert torch.equal(out.advantages != 0, MASK.bool())
    out = build("algorithm.norm_adv_by_std=false").compute_advantages(scored(), {})
    assert per_sample(out.advantages) == pytest.approx([0.5, -0.5, 0.125, -0.125])


def test_rloo_leaves_each_sample_out_of_its_baseline(build):
    # A_i = r_i - the other sample's score
    out = build("algorithm.adv_estimator=rloo").compute_advantages(scored(), {})
    assert per_sample(out.advantages) == pytest.approx([1.0, -1.0, 0.25, -0.25])


def test_remax_subtracts_the_greedy_baseline(build):
    controller = build("algorithm.adv_estimator=remax")
    assert controller.needs_baselines   # the step generates the greedy baselines (timing_s/gen_baseline)
    out = controller.compute_advantages(scored(baselines=torch.tensor([0.5, 0.5, 1.0, 1.0])), {})
    assert per_sample(out.advantages) == pytest.approx([0.5, -0.5, -0.5, -0.75])


def test_reinforce_plus_plus_baseline_whitens_over_the_batch(build):
    # r - group mean = 0.5, -0.5, 0.125, -0.125 on 3, 2, 1, 3 tokens: 9 values, mean 0.5/9, then / unbiased std
    out = build("algorithm.adv_estimator=reinforce_plus_plus_baseline").compute_advantages(scored(), {})
    values = [0.5] * 3 + [-0.5] * 2 + [0.125] + [-0.125] * 3
    mean = sum(values) / 9
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 8)
    assert per_sample(out.advantages) == pytest.approx([(v - mean) / std for v in (0.5, -0.5, 0.125, -0.125)],
                                                       abs=1e-5)


def test_grpo_passk_credits_only_each_groups_best_sample(build):
    # the best of each group gets its margin over the second best, over the group std
    out = build("algorithm.adv_estimator=grpo_passk").compute_advantages(scored(), {})
    assert per_sample(out.advantages) == pytest.approx([1 / 0.70711, 0.0, 0.25 / 0.17678, 0.0], abs=1e-3)


def test_kl_in_the_reward_reaches_reinforce_plus_plus_returns(build):
    # k1 KL = old - ref = 0.5 on every token; coefficient 0.1: -0.05 per token, the score at the last one
    controller = build("algorithm.adv_estimator=reinforce_plus_plus", "algorithm.use_kl_in_reward=true",
                       "algorithm.kl_ctrl.kl_coef=0.1")
    assert controller.need_old_log_probs and controller.needs_ref
    metrics: dict = {}
    out = controller.compute_advantages(scored(old_log_probs=torch.full((4, 3), -1.0),
                                               ref_log_probs=torch.full((4, 3), -1.5)), metrics)
    assert metrics["kl_in_reward/kl_mean"] == pytest.approx(0.5)
    close(out.token_level_rewards, [[-0.05, -0.05, 0.95], [-0.05, -0.05, 0.0], [0.45, 0.0, 0.0], [-0.05, -0.05, 0.2]])
    # returns: the sums of the rewards from each token on (gamma = 1)
    close(out.returns, [[0.85, 0.9, 0.95], [-0.1, -0.05, 0.0], [0.45, 0.0, 0.0], [0.1, 0.15, 0.2]])


def test_the_adaptive_kl_coefficient_follows_the_measured_kl(build):
    # KL 0.5 against target 0.1: error clipped to +0.2; 4 samples over horizon 100 -> x (1 + 0.2 * 4 / 100)
    controller = build("algorithm.adv_estimator=rloo", "algorithm.use_kl_in_reward=true",
                       "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.1",
                       "algorithm.kl_ctrl.target_kl=0.1", "algorithm.kl_ctrl.horizon=100")
    batch = scored(old_log_probs=torch.full((4, 3), -1.0), ref_log_probs=torch.full((4, 3), -1.5))
    controller.compute_advantages(batch, {})
    assert controller.kl_ctrl.value == pytest.approx(0.1 * 1.008)
    out = controller.compute_advantages(batch, {})   # the next step's penalty uses the moved coefficient
    assert out.token_level_rewards[0, 0].item() == pytest.approx(-0.5 * 0.1 * 1.008)
    assert controller.kl_ctrl.value == pytest.approx(0.1 * 1.008 ** 2)


def test_mask_truncated_takes_truncated_samples_out_of_the_loss(build):
    truncated = torch.tensor([False, False, False, True])
    out = build("actor.mask_truncated=true").compute_advantages(scored(truncated=truncated), {})
    assert out.response_mask.tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]]
    assert out.advantages[3].abs().sum() == 0
    out = build().compute_advantages(scored(truncated=truncated), {})
    assert out.response_mask.tolist() == MASK.tolist()


# -- generate_and_score: a scripted rollout worker -------------------------------------------------------------

class ScriptedRollout:
    """Stands on the rollout rank: sample j of a prompt completes it with `script(prompt text)[j]`; tokens are
    one id per character (4 at most: rollout.max_new_tokens), truncated when the completion is longer."""

    def __init__(self, script):
        self.script, self.calls = script, 0

    def rollout(self, items, params, seed=None, complete=None):  # RolloutWorker.rollout's signature
        self.calls += 1
        texts = [self.script(ITEMS[it.index].prompt_text, self.calls)[j] for it in items for j in range(params.n)]
        lengths = torch.tensor([min(len(t), 4) for t in texts])
        mask = (torch.arange(4)[None, :] < lengths[:, None]).long()
        b = len(texts)
        return Batch(prompt_ids=torch.ones(b, 2, dtype=torch.long), prompt_mask=torch.ones(b, 2, dtype=torch.long),
                     response_ids=mask.clone(), response_mask=mask, rollout_log_probs=torch.zeros(b, 4),
                     group_ids=torch.arange(len(items)).repeat_interleave(params.n),
                     truncated=torch.tensor([len(t) > 4 for t in texts]),
                     policy_version=torch.zeros(b, dtype=torch.long),
                     completions=[t[:4] for t in texts], infos=[SampleInfo() for _ in texts])

    def close(self):
        pass

    def wake(self):  # the hf engine sleeps (frees its KV cache) while a colocated actor trains
        pass

    def sleep(self):
        pass


def scripted(controller: Controller, script) -> ScriptedRollout:
    worker = ScriptedRollout(script)
    controller.rollout.pool.hosts[0].roles["rollout"] = worker
    return worker


def answer(prompt):
    return str(eval(prompt[:-1]))   # "3+4=" -> "7"


def right_and_wrong(prompt, call):
    return [answer(prompt), "x"]


def test_scores_come_from_the_reward_function_on_the_scripted_completions(build):
    controller = build()
    scripted(controller, right_and_wrong)
    metrics: dict = {}
    batch, items = controller.generate_and_score(1, StageTimer(), metrics)
    assert len(items) == 2 and batch.completions == [c for it in items for c in (answer(it.prompt_text), "x")]
    assert batch.scores.tolist() == [1.0, 0.0, 1.0, 0.0] and batch.rows == [it.row for it in items for _ in range(2)]
    assert metrics["response_length/mean"] == 1.0


def test_dynamic_sampling_draws_until_the_step_has_groups_with_signal(build):
    # the first draw's samples are all right (no group has signal), the second draw's right and wrong
    def script(prompt, call):
        return [answer(prompt)] * 2 if call == 1 else right_and_wrong(prompt, call)

    controller = build("algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_draws=4")
    worker = scripted(controller, script)
    metrics: dict = {}
    batch, items = controller.generate_and_score(1, StageTimer(), metrics)
    assert worker.calls == 2 and metrics["filter_groups/draws"] == 2 and metrics["filter_groups/signal_groups"] == 2
    assert batch.scores.tolist() == [1.0, 0.0, 1.0, 0.0] and batch.group_ids.tolist() == [0, 0, 1, 1]
    assert batch.completions == [c for it in items for c in (answer(it.prompt_text), "x")]
    # without it the step takes what the first draw gave
    plain = build()
    worker = scripted(plain, script)
    batch, _ = plain.generate_and_score(1, StageTimer(), {})
    assert worker.calls == 1 and batch.scores.tolist() == [1.0] * 4


def test_overlong_shaping_penalises_the_last_tokens_of_the_budget(build):
    # budget 4, buffer 2: a 3-token completion is 1 token into the buffer: -1/2 x factor 1; 4 tokens: -1
    controller = build("reward.overlong_buffer_len=2", "reward.overlong_penalty_factor=1.0")
    scripted(controller, lambda prompt, call: ["3", "333"] if prompt == "1+2=" else ["7777", "7"])
    batch, _ = controller.generate_and_score(1, StageTimer(), {})
    assert batch.scores.tolist() == pytest.approx([1.0, -0.5, -1.0, 1.0])


# -- the actor's options: the controller builds the actor with them and fetches what they need -----------------

@pytest.mark.parametrize("overrides, loss, needs_old, needs_ref", [
    (["actor.policy_loss=cispo", "actor.minibatches=2"], "cispo", True, False),
    (["actor.policy_loss=reinforce"], "reinforce", False, False),
    (["actor.rollout_is=token"], "ppo", False, False),
    (["actor.rollout_is=sequence", "actor.epochs=2"], "ppo", True, False),
    (["actor.entropy_coeff=0.01", "actor.kl_coef=0.1", "actor.kl_estimator=k3+"], "ppo", False, True),
    (["actor.loss_agg_mode=seq-mean-token-sum"], "ppo", False, False),
])
def test_actor_options_reach_the_actor_worker(build, overrides, loss, needs_old, needs_ref):
    controller = build(*overrides)
    worker = controller.actor.pool.hosts[0].roles["actor"]
    assert worker.policy_loss is POLICY_LOSSES.resolve(loss)
    for override in overrides:
        key, value = override.split("=")
        assert str(getattr(worker.cfg, key.split(".")[1])) == value
    assert (controller.need_old_log_probs, controller.needs_ref, controller.ref is not None) == \
        (needs_old, needs_ref, needs_ref)

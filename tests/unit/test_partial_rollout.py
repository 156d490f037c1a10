"""Partial rollout (rollout.partial): staleness metrics by hand, a sample paused at a token boundary and continued
later (the same tokens with the same weights; with new weights, the log-probs of the weights that sampled each
token), the pause once enough groups are complete, stale groups restarted, the pool saved and loaded, and the
config's refusals."""

import copy
from functools import partial

import pytest
import torch

from grpoflow.config import ConfigError, load_config
from grpoflow.controller.partial import Group, PartialQueue, partial_metrics
from grpoflow.controller.rollouts import Rollouts
from grpoflow.data.dataset import PromptItem
from grpoflow.data.sampler import EpochSampler
from grpoflow.distributed.worker_group import WorkerGroup, broadcast
from grpoflow.models.loading import load_causal_lm
from grpoflow.models.tiny import build_char_tokenizer, build_tiny_model
from grpoflow.trajectories.loop import RolloutItem, SingleTurn
from grpoflow.trajectories.rollout import run_rollout
from grpoflow.trajectories.trajectory import EndState, Segment, Trajectory, to_batch
from grpoflow.trajectories.turns import Carried, info_of
from grpoflow.engines.hf import HFRolloutEngine
from grpoflow.engines.protocol import SamplingParams
from grpoflow.workers.rollout import RolloutWorker

TOK = build_char_tokenizer()
MODEL = build_tiny_model(TOK, size="0.5m").eval()
PARAMS = SamplingParams(n=1, max_new_tokens=12)


def test_staleness_metrics_by_hand():
    versions = torch.tensor([[3, 3, 4, 0], [2, 4, 4, 4], [4, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    m = partial_metrics(versions, mask, version=4)
    # staleness 4 - v on the sampled tokens: [1, 1, 0], [2, 0, 0, 0], [0]; worst per sample 1, 2, 0;
    # mean per sample 2/3, 2/4, 0; samples spanning several versions: the first two
    assert m["rollout/partial/staleness/max"] == 2
    assert m["rollout/partial/staleness/sample_max_mean"] == pytest.approx(1.0)
    assert m["rollout/partial/staleness/mean"] == pytest.approx((2 / 3 + 0.5 + 0) / 3)
    assert m["rollout/partial/multi_version_frac"] == pytest.approx(2 / 3)


def engine(model=MODEL):
    return HFRolloutEngine(copy.deepcopy(model), pad_token_id=TOK.pad_token_id, eos_token_id=TOK.eos_token_id)


def item(text, position, carried, seed=0):
    return RolloutItem(TOK.encode(text, add_special_tokens=False), 0, position, carried=carried, seed=seed)


def begun(text, ids, log_probs, versions):
    """A single-turn sample of `text` paused after `ids`."""
    return Trajectory(TOK.encode(text, add_special_tokens=False), [], end=EndState.PAUSED,
                      open=Segment(list(ids), list(log_probs), min(versions), list(versions)))


def play(eng, items, quota):
    batch = run_rollout(SingleTurn(TOK), eng, items, PARAMS, None, quota=quota, pad_token_id=TOK.pad_token_id)
    out = []
    for r, info in enumerate(batch.carried):
        if info.paused:  # its tokens so far are its open turn (the row of a paused sample is not trained)
            o = info.trajectory.open
            out.append((o.ids, torch.tensor(o.log_probs), o.versions, info))
            continue
        length = int(batch.response_mask[r].sum())
        out.append((batch.response_ids[r, :length].tolist(), batch.rollout_log_probs[r, :length],
                    batch.token_versions[r, :length].tolist(), info))
    return out


def pause_after_nine(eng):
    """Y (fresh) next to Z, which carries 3 tokens (9 left): with quota 1 the rollout pauses when Z completes, at
    tick 9, so Y pauses with its first 9 tokens."""
    z = begun("3+4=", TOK.encode("abc", add_special_tokens=False), [0.0] * 3, [0] * 3)
    (y_ids, y_lp, y_versions, y_info), (z_ids, _, _, z_info) = play(
        eng, [item("12+7=", 0, [None]), item("3+4=", 1, [z], seed=77)], quota=1)
    assert z_info.finished_at == 9 and not z_info.paused and len(z_ids) == 12  # setup: no EOS before the budget
    assert y_info.paused and len(y_ids) == 9 and y_versions == [0] * 9
    assert z_info.trajectory is None  # a finished sample comes back as its row alone
    return y_info.trajectory


@torch.no_grad()
def forced(model, prompt, ids):
    logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1:-1]
    return lp.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


def test_a_paused_sample_continued_with_the_same_weights_samples_what_it_would_have_uninterrupted():
    eng = engine()
    y = pause_after_nine(eng)
    (ids, lp, versions, info), = play(eng, [item("12+7=", 0, [y])], quota=1)
    assert not info.paused and len(ids) == 12 and ids[:9] == y.open.ids
    # the plain single-turn sample of this prompt (dataset index 0, seed None), never paused
    alone = run_rollout(SingleTurn(TOK), engine(), [RolloutItem(TOK.encode("12+7=", add_special_tokens=False), 0, 0)],
                        PARAMS, None, pad_token_id=TOK.pad_token_id)
    assert ids == alone.response_ids[0, :int(alone.response_mask[0].sum())].tolist()  # drawn on at its offset
    torch.testing.assert_close(lp, alone.rollout_log_probs[0, :12], atol=2e-5, rtol=0)


def test_continued_log_probs_are_those_of_the_weights_that_sampled_each_token():
    eng = engine()
    y = pause_after_nine(eng)
    new = copy.deepcopy(MODEL)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    eng.update_weights(new.named_parameters(), version=1)
    (ids, lp, versions, info), = play(eng, [item("12+7=", 0, [y])], quota=1)
    prompt = TOK.encode("12+7=", add_special_tokens=False)
    assert not info.paused and len(ids) == 12 and versions == [0] * 9 + [1] * 3
    expected = torch.cat([forced(MODEL, prompt, ids)[:9], forced(new, prompt, ids)[9:]])
    torch.testing.assert_close(lp, expected, atol=2e-5, rtol=0)
    # the new weights differ enough that the old ones' log-probs of the last tokens are not what was recorded
    assert (forced(MODEL, prompt, ids)[9:] - lp[9:]).abs().max() > 1e-3


def test_a_group_that_must_finish_keeps_the_rollout_going_past_the_quota():
    z = begun("3+4=", TOK.encode("abc", add_special_tokens=False), [0.0] * 3, [0] * 3)
    y = item("12+7=", 0, [None])
    y.must_finish = True
    (y_ids, _, _, y_info), (_, _, _, z_info) = play(engine(), [y, item("3+4=", 1, [z], seed=77)], quota=1)
    assert z_info.finished_at == 9 and not y_info.paused and len(y_ids) == 12 and y_info.finished_at == 12


@pytest.fixture(scope="module")
def rollout_group(tiny_model_path):
    return WorkerGroup("rollout", partial(RolloutWorker, model_path=tiny_model_path))


def prompt_items():
    texts = [f"{a}+{b}=" for a in range(10, 30) for b in (3, 41)]
    return [PromptItem(TOK.encode(t, add_special_tokens=False), t, {"prompt": t}, "s", index=i)
            for i, t in enumerate(texts)]


def partial_queue(group, items, version, **kw):
    # the untrained model rarely samples EOS: the digits end a sample too, so that lengths vary (mean about 10)
    digits = tuple(TOK.convert_tokens_to_ids(list("0123456789")))
    options = dict(prompts_per_step=4, params=SamplingParams(n=2, max_new_tokens=30, stop_token_ids=digits),
                   oversample=2.0,
                   max_staleness=1, seed_of=lambda step: 100 + step, version=version, pad_token_id=TOK.pad_token_id)
    return PartialQueue(Rollouts(group), items, EpochSampler(len(items), seed=0), **{**options, **kw})


def test_the_queue_trains_the_first_complete_groups_restarts_stale_ones_and_saves_its_pool(rollout_group,
                                                                                           tiny_model_path, tmp_path):
    items, version = prompt_items(), [0]
    queue = partial_queue(rollout_group, items, lambda: version[0])
    pending = queue.take(1)
    batch, _ = pending.result()
    assert len(batch) == 8 and batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert pending.metrics["rollout/partial/new_groups"] == 8 and len(queue.pool) == 4
    assert pending.metrics["rollout/partial/carried_groups"] == 4
    assert all(g.done_at is None or g.done_at[0] == 1 for g in queue.pool)
    paused = [p for g in queue.pool for p in g.samples if isinstance(p, Trajectory)]
    assert paused and any(p.open.ids for p in paused), "nothing was left unfinished: the test needs a pause"
    assert all(p.end is EndState.PAUSED for p in paused)
    # saved and loaded (through a weights-only file), the pool is the same: trajectories, rows and all
    state = queue.state_dict()
    torch.save(state, tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    loaded = partial_queue(rollout_group, items, lambda: version[0])
    loaded.load_state_dict(state["sampler"], 1, state["in_flight"])
    assert [(g.item, g.seed, g.done_at) for g in loaded.pool] == [(g.item, g.seed, g.done_at) for g in queue.pool]
    for g, h in zip(loaded.pool, queue.pool):
        for a, b in zip(g.samples, h.samples):
            assert type(a) is type(b)
            if isinstance(a, Trajectory):
                assert a == b
            elif a is not None:
                assert a.infos == b.infos and a.rows == b.rows and a.response_ids.tolist() == b.response_ids.tolist()
                assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)
    # two versions later (the same weights, as version 2), every carried group that holds a token of version 0 is
    # too stale: restarted
    version[0] = 2
    weights = list(load_causal_lm(tiny_model_path).named_parameters())
    rollout_group.call(RolloutWorker.update_weights, broadcast(weights), 2)
    stale = sum(g.oldest is not None for g in queue.pool)
    pending = queue.take(2)
    assert pending.metrics["rollout/partial/restarted_groups"] == stale > 0
    batch, _ = pending.result()
    assert batch.token_versions[batch.response_mask.bool()].min() == 2  # nothing older than 1 version is trained


def test_groups_one_step_from_too_stale_finish_in_the_next_rollout_and_are_trained(rollout_group, tiny_model_path):
    items = prompt_items()
    version = [0]
    queue = partial_queue(rollout_group, items, lambda: version[0])
    weights = list(load_causal_lm(tiny_model_path).named_parameters())
    rollout_group.call(RolloutWorker.update_weights, broadcast(weights), 0)  # the engine is shared by the module
    queue.take(1)
    started = sum(g.oldest is not None for g in queue.pool)
    assert started, "nothing was left unfinished: the test needs a pause"
    rollout_group.call(RolloutWorker.update_weights, broadcast(weights), 1)
    version[0] = 1
    pending = queue.take(2)  # max_staleness 1: a group with a version-0 token is due at version 1
    assert pending.metrics["rollout/partial/due_groups"] == started
    assert pending.metrics["rollout/partial/restarted_groups"] == 0
    assert all(g.oldest is None or g.oldest == 1 for g in queue.pool)  # every version-0 token was trained
    batch, _ = pending.result()
    assert pending.metrics["rollout/partial/staleness/max"] == 1 == batch.token_versions.max() - \
        batch.token_versions[batch.response_mask.bool()].min()


def row(item, text, version=3):
    """The training row of a finished single-turn sample `text` of `item`, sampled by weights `version`, as a
    rollout worker gives it back."""
    ids = TOK.encode(text, add_special_tokens=False)
    t = Trajectory(item.prompt_ids, [{"role": "assistant", "content": text}],
                   [Segment(ids, [-1.0] * len(ids), version, [version] * len(ids))], turns=1, end=EndState.EOS)
    batch = to_batch([t], pad_token_id=TOK.pad_token_id, prompt_texts=[], rows=[], multi_turn=False)
    return batch.replace(infos=[info_of(t)], carried=[Carried()])


def test_complete_groups_carried_over_are_trained_first_in_the_order_they_completed(rollout_group):
    items = prompt_items()
    queue = partial_queue(rollout_group, items, lambda: 3, prompts_per_step=2, oversample=2.0)

    queue.pool = [Group(7, 0, [row(items[7], "a"), row(items[7], "bb")], (1, 5)),
                  Group(3, 1, [None, row(items[3], "c")]),
                  Group(9, 0, [row(items[9], "ddd"), row(items[9], "e")], (1, 2))]
    pending = queue.take(2)
    batch, busy = pending.result()
    assert busy == 0.0  # two groups were complete already: no rollout ran
    assert [items.index(it) for it in pending.items] == [9, 7]  # completed at tick 2 of step 1, then at tick 5
    assert batch.completions == ["ddd", "e", "a", "bb"] and batch.group_ids.tolist() == [0, 0, 1, 1]
    # the pool was topped up to 4 groups by one new prompt (not played yet); the unfinished group stays first
    assert pending.metrics["rollout/partial/new_groups"] == 1 and [g.item for g in queue.pool][0] == 3
    assert len(queue.pool) == 2 and all(p is None for p in queue.pool[1].samples)


def test_a_sample_finished_earlier_stays_in_its_place_while_its_sibling_plays(rollout_group):
    # group 3's first sample finished in an earlier rollout (its row is held, it is not sent again); the rollout plays
    # its second alone, which comes back into place 1, and the step trains the two rows in order
    items = prompt_items()
    queue = partial_queue(rollout_group, items, lambda: 0, prompts_per_step=1, oversample=1.0)
    queue.pool = [Group(3, 1, [row(items[3], "c", version=0), None])]
    batch, busy = queue.take(2).result()
    assert busy > 0 and len(batch) == 2 and batch.group_ids.tolist() == [0, 0] and batch.completions[0] == "c"
    assert batch.rows == [items[3].row] * 2 and batch.response_mask[1].sum() > 0 and queue.pool == []


def test_a_due_group_is_trained_before_one_that_completed_earlier(rollout_group):
    # staleness bound 1, engines at version 3: group 9 holds version-2 tokens (due: one more step would make them
    # too stale), group 7 only version-3 ones; one group per step, the due one goes first
    items = prompt_items()
    queue = partial_queue(rollout_group, items, lambda: 3, prompts_per_step=1, oversample=2.0)
    queue.pool = [Group(7, 0, [row(items[7], "a", version=3)] * 2, (1, 2)),
                  Group(9, 0, [row(items[9], "b", version=2)] * 2, (1, 9))]
    pending = queue.take(2)
    assert pending.result()[1] == 0.0 and [items.index(it) for it in pending.items] == [9]
    assert pending.metrics["rollout/partial/due_groups"] == 1 and [g.item for g in queue.pool] == [7]


@pytest.mark.parametrize("override, says", [
    ("rollout.agent.program=x.py:run", "an AgentEpisodes trajectory holds state that cannot be saved or replayed"),
    ("rollout.engine=sglang", "rollout.engine=sglang declares no pausing.*use rollout.engine=hf"),
    ("rollout.engine=vllm rollout.multi_turn.tools=[calculator]",
     "rollout.engine=vllm declares pausing without exact_resume.*pauses single-turn samples only"),
    ("algorithm.filter_groups.enable=true", "use one of them"),
    ("rollout.partial.oversample=0.9", "rollout.partial.oversample must be >= 1"),
])
def test_the_config_refuses_what_partial_rollout_cannot_do(override, says):
    from grpoflow.plan.checks import check_config

    with pytest.raises(ConfigError, match=says):
        check_config(load_config(None, ["rollout.partial.enable=true", *override.split()]))


@pytest.mark.parametrize("declared, multi_turn, refused", [
    ({"pausing": True, "exact_resume": True}, True, None),
    ({"pausing": True}, False, None),
    ({"pausing": True}, True, "declares pausing without exact_resume"),
    ({}, False, "declares no pausing"),
])
def test_partial_rollout_asks_what_the_engine_and_the_kind_declare(declared, multi_turn, refused):
    """Not the engine's name: an engine registered with its abilities is taken or refused by them alone."""
    from grpoflow.engines.factory import ROLLOUT_ENGINES, register_rollout_engine
    from grpoflow.plan.checks import check_partial

    register_rollout_engine("declared_test_engine", override=True, **declared)(lambda model_path, **_: None)
    try:
        cfg = load_config(None, ["rollout.partial.enable=true", "rollout.engine=declared_test_engine",
                                 *(["rollout.multi_turn.env=guess_number"] if multi_turn else [])])
        if refused is None:
            check_partial(cfg)
        else:
            with pytest.raises(ConfigError, match=f"rollout.engine=declared_test_engine {refused}"):
                check_partial(cfg)
    finally:
        ROLLOUT_ENGINES._fns.pop("declared_test_engine")
        ROLLOUT_ENGINES._meta.pop("declared_test_engine")


@pytest.mark.parametrize("multi_turn", ["rollout.multi_turn.tools=[calculator]", "rollout.multi_turn.env=guess_number"])
def test_conversations_with_environments_and_tools_may_pause(multi_turn):
    assert load_config(None, ["rollout.partial.enable=true", multi_turn]).rollout.partial.enable


def test_top_p_below_one_is_refused_since_the_importance_weights_need_the_full_distribution():
    from grpoflow.plan.checks import check_config
    with pytest.raises(ConfigError, match=r"rollout.partial turns it on.*rollout.top_p=1 or actor.rollout_is=off"):
        check_config(load_config(None, ["rollout.partial.enable=true", "rollout.top_p=0.9"]))


def test_async_mode_is_refused_and_token_level_is_is_on():
    with pytest.raises(ConfigError, match="use trainer.mode=sync with rollout.partial"):
        load_config(None, ["rollout.partial.enable=true", "trainer.mode=async", "backend=ray", "placement=split"])
    assert load_config(None, ["rollout.partial.enable=true"]).actor.rollout_is == "token"
    assert load_config(None, []).actor.rollout_is == "off"

"""controller/train_samples.py: which groups are written, what a sample's line holds (hand values), the
segments of trained and untrained tokens, the file following resume, and the writer never blocking a step."""

import json
import threading

import pytest
import torch

from grpoflow.controller.train_samples import TrainSamples, first_groups, group_records, segments, short_row
from grpoflow.data.batch import Batch


def decode(ids):
    return "".join(chr(ord("a") + i) for i in ids)


def scored_batch() -> Batch:
    """2 groups x 2 samples. Sample 2 is multi-turn: model 'ab', environment 'c', model 'd'; sample 3 was cut."""
    response_ids = torch.tensor([[0, 1, 9, 9], [2, 3, 4, 9], [0, 1, 2, 3], [5, 6, 7, 8]])
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1], [1, 1, 1, 1]])
    attention = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    return Batch(prompt_ids=torch.ones(4, 2, dtype=torch.long), prompt_mask=torch.ones(4, 2, dtype=torch.long),
                 response_ids=response_ids, response_mask=response_mask, response_attention=attention,
                 group_ids=torch.tensor([0, 0, 1, 1]), scores=torch.tensor([1.0, 0.0, 0.5, 0.25]),
                 truncated=torch.tensor([False, False, False, True]),
                 policy_version=torch.tensor([3, 3, 4, 4]),
                 prompts=["1+1=", "1+1=", "guess", "guess"], completions=["2", "11", "4", "5678"],
                 rows=[{"prompt": "1+1=", "answer": "2", "extra": [1]}] * 2 + [{"data_source": "game"}] * 2,
                 reward_parts=[{"exact": 1.0}, {"exact": 0.0}, {"env": 0.5}, {"env": 0.25}],
                 conversations=[])


def advantages_and_loss_mask(batch):
    # advantages as an outcome estimator gives them (one value per sample), except sample 2 which varies
    # per token; sample 3 is truncated and masked out (actor.mask_truncated)
    adv = torch.tensor([[0.7, 0.7, 0.0, 0.0], [-0.7, -0.7, -0.7, 0.0], [1.0, 3.0, 0.0, 2.0], [-1.0] * 4])
    loss_mask = batch.response_mask.clone()
    loss_mask[3] = 0
    return batch.replace(advantages=adv, response_mask=loss_mask)


def test_first_groups_takes_whole_groups_in_batch_order():
    assert first_groups([5, 5, 2, 2, 7, 7], 2) == [0, 1, 2, 3]
    assert first_groups([1, 0, 1, 0, 2], 1) == [0, 2]     # an agent batch's rows of a group need not be adjacent
    assert first_groups([0, 0], 5) == [0, 1]


def test_a_group_line_holds_each_sample_with_hand_values():
    batch = scored_batch()
    trained = advantages_and_loss_mask(batch)
    g0, g1 = group_records(7, batch, trained.advantages, trained.response_mask, decode=decode)
    assert (g0["step"], g0["group"], g0["data_source"], g0["prompt"]) == (7, 0, "default", "1+1=")
    assert g0["row"] == {"answer": "2"}  # scalar columns only, the prompt left out
    first = g0["samples"][0]
    assert first == {"completion": "2", "score": 1.0, "reward_parts": {"exact": 1.0}, "advantage": pytest.approx(0.7),
                     "length": 2, "trained_tokens": 2, "policy_version": 3, "truncated": False}
    assert g1["data_source"] == "game"
    multi, cut = g1["samples"]
    # advantage: the mean over the model's tokens, (1 + 3 + 2) / 3 = 2 (not the environment's 0); length: 3
    assert multi["advantage"] == pytest.approx(2.0) and multi["length"] == 3 and multi["trained_tokens"] == 3
    assert multi["segments"] == [{"text": "ab", "tokens": 2, "source": "model", "trained": True},
                                 {"text": "c", "tokens": 1, "source": "env", "trained": False},
                                 {"text": "d", "tokens": 1, "source": "model", "trained": True}]
    # truncated and masked: nothing trained, the advantage the estimator gave (-1) still shown
    assert cut["trained_tokens"] == 0 and cut["advantage"] == pytest.approx(-1.0) and cut["truncated"]
    assert cut["segments"] == [{"text": "fghi", "tokens": 4, "source": "model", "trained": False}]
    assert "segments" not in first  # all its tokens trained: the completion says it all


def test_segments_split_on_source_and_training():
    assert segments([0, 1, 2, 3], [True, True, False, True], [True, False, False, True], decode) == [
        {"text": "a", "tokens": 1, "source": "model", "trained": True},
        {"text": "b", "tokens": 1, "source": "model", "trained": False},
        {"text": "c", "tokens": 1, "source": "env", "trained": False},
        {"text": "d", "tokens": 1, "source": "model", "trained": True}]
    assert segments([], [], [], decode) == []


def test_short_row_cuts_long_values():
    assert short_row({"prompt": "x", "doc": "y" * 500, "n": 3, "nested": {"a": 1, "b": {"deeper": 2}}}) == \
        {"doc": "y" * 200 + "…", "n": 3, "nested.a": 1}


def test_short_row_keeps_verls_nested_ground_truth_and_extra_info():
    row = {"prompt": [{"role": "user", "content": "q"}], "data_source": "openai/gsm8k",
           "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": {"split": "train", "index": 4}}
    assert short_row(row) == {"data_source": "openai/gsm8k", "reward_model.style": "rule",
                              "reward_model.ground_truth": "72", "extra_info.split": "train", "extra_info.index": 4}


def recorder(tmp_path, **kw):
    return TrainSamples(tmp_path, every=kw.pop("every", 2), groups=kw.pop("groups", 1), load_decode=lambda: decode,
                        **kw)


def test_every_k_steps_the_first_groups_then_resume_keeps_the_steps_before(tmp_path):
    batch = scored_batch()
    trained = advantages_and_loss_mask(batch)
    rec = recorder(tmp_path)
    rec.start(0)
    for step in range(1, 7):
        rec.record(step, batch, trained)
    rec.flush()
    lines = [json.loads(line) for line in (tmp_path / "train_samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["group"]) for r in lines] == [(2, 0), (4, 0), (6, 0)]
    rec.start(4)  # resumed from the step-4 checkpoint: step 6 is trained again
    assert [json.loads(line)["step"] for line in (tmp_path / "train_samples.jsonl").read_text().splitlines()] == [2, 4]
    rec.start(0)  # a fresh run
    assert (tmp_path / "train_samples.jsonl").read_text() == ""
    rec.close()


def test_off_writes_nothing(tmp_path):
    rec = recorder(tmp_path, every=0)
    rec.start(0)
    rec.record(2, scored_batch(), advantages_and_loss_mask(scored_batch()))
    rec.close()
    assert not (tmp_path / "train_samples.jsonl").exists()


def test_a_full_queue_drops_and_counts_instead_of_blocking_the_step(tmp_path):
    gate = threading.Event()

    def slow_decode():
        gate.wait(10)
        return decode

    rec = TrainSamples(tmp_path, every=1, groups=2, load_decode=slow_decode, queue_size=1)
    batch = scored_batch()
    trained = advantages_and_loss_mask(batch)
    for step in range(1, 5):   # the writer holds step 1, the queue step 2; steps 3 and 4 do not fit
        rec.record(step, batch, trained)
    assert rec.dropped >= 1
    gate.set()
    rec.close()
    steps = {json.loads(line)["step"] for line in (tmp_path / "train_samples.jsonl").read_text().splitlines()}
    assert 1 in steps and len(steps) == 4 - rec.dropped

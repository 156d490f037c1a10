"""grpoflow.data.batch.Batch: select / split / concat / trimmed keep every field row-aligned."""

import dataclasses

import pytest
import torch

from grpoflow.data.batch import Batch

PAD = 99  # distinct from 0 so pad-token fill and mask fill can be told apart


def make_batch(prompt_lengths, response_lengths, width_p=None, width_r=None, seed=0) -> Batch:
    """Left-padded prompts, right-padded responses, every optional field set, row i's tokens start at 10*i."""
    gen = torch.Generator().manual_seed(seed)
    b = len(prompt_lengths)
    P = width_p or max(prompt_lengths)
    R = width_r or max(response_lengths)
    prompt_ids = torch.full((b, P), PAD, dtype=torch.long)
    prompt_mask = torch.zeros(b, P, dtype=torch.long)
    response_ids = torch.full((b, R), PAD, dtype=torch.long)
    response_mask = torch.zeros(b, R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        if p:
            prompt_ids[i, P - p:] = torch.arange(p) + 10 * i + 1000
            prompt_mask[i, P - p:] = 1
        response_ids[i, :r] = torch.arange(r) + 10 * i + 2000
        response_mask[i, :r] = 1
    per_token = lambda: torch.randn(b, R, generator=gen) * response_mask  # noqa: E731
    return Batch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        group_ids=torch.arange(b) // 2,
        rollout_log_probs=per_token(),
        old_log_probs=per_token(),
        ref_log_probs=per_token(),
        scores=torch.arange(b, dtype=torch.float32) / 10,
        advantages=per_token(),
        prompts=[f"prompt {i}" for i in range(b)],
        completions=[f"completion {i}" for i in range(b)],
        rows=[{"answer": str(i)} for i in range(b)],
        conversations=[[{"role": "user", "content": f"turn {i}"}] for i in range(b)],
        infos=[{"turns": i} for i in range(b)], carried=[{"episode": i} for i in range(b)],
        reward_parts=[{"part": i / 10} for i in range(b)],
    )


def assert_batches_equal(a: Batch, b: Batch) -> None:
    for f in dataclasses.fields(Batch):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if isinstance(va, torch.Tensor):
            assert isinstance(vb, torch.Tensor), f.name
            assert va.shape == vb.shape, f.name
            assert va.dtype == vb.dtype, f.name
            assert torch.equal(va, vb), f.name
        else:
            assert va == vb, f.name


def test_properties_concatenate_prompt_then_response():
    batch = make_batch([2, 3, 1], [1, 3, 2])
    assert len(batch) == 3
    assert batch.input_ids.shape == (3, 3 + 3)
    assert torch.equal(batch.input_ids[:, :3], batch.prompt_ids)
    assert torch.equal(batch.input_ids[:, 3:], batch.response_ids)
    assert torch.equal(batch.attention_mask, torch.tensor([
        [0, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 0],
    ]))
    assert batch.response_lengths.tolist() == [1, 3, 2]


def test_select_reorders_every_tensor_and_list():
    batch = make_batch([2, 3, 1, 2], [1, 3, 2, 2])
    order = [2, 0, 3]
    picked = batch.select(order)
    assert len(picked) == 3
    for f in dataclasses.fields(Batch):
        v, w = getattr(batch, f.name), getattr(picked, f.name)
        if isinstance(v, torch.Tensor):
            assert torch.equal(w, v[order]), f.name
        elif v is None:
            assert w is None, f.name
        else:
            assert w == [v[i] for i in order], f.name
    assert picked.prompts == ["prompt 2", "prompt 0", "prompt 3"]
    assert picked.group_ids.tolist() == [1, 0, 1]


def test_environment_tokens_are_attended_but_not_trained():
    # row 0: model, env, env, model; row 1: model, padding: the attention mask covers the env tokens
    batch = make_batch([1, 1], [4, 1]).replace(
        response_mask=torch.tensor([[1, 0, 0, 1], [1, 0, 0, 0]]),
        response_attention=torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]]))
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch.response_lengths.tolist() == [2, 1]   # the model's tokens
    assert batch.trimmed().response_ids.shape[1] == 4  # the env tokens are not trimmed away
    assert batch.tensors().conversations == [] and batch.tensors().infos == [] and batch.tensors().carried == []


def test_select_accepts_a_tensor_index_and_repeats():
    batch = make_batch([1, 2], [2, 1])
    picked = batch.select(torch.tensor([1, 1, 0]))
    assert picked.completions == ["completion 1", "completion 1", "completion 0"]
    assert torch.equal(picked.response_ids, batch.response_ids[[1, 1, 0]])


def test_select_keeps_unset_fields_unset():
    batch = make_batch([1, 2], [2, 1]).replace(advantages=None, prompts=[])
    picked = batch.select([1])
    assert picked.advantages is None
    assert picked.prompts == []


@pytest.mark.parametrize("n", [7, 8, 9, 3])
def test_split_into_three_sizes_differ_by_at_most_one_and_concat_restores(n):
    batch = make_batch([1 + i % 3 for i in range(n)], [1 + i % 4 for i in range(n)], seed=n)
    parts = batch.split(3)
    assert len(parts) == 3
    sizes = [len(p) for p in parts]
    assert sum(sizes) == n
    assert max(sizes) - min(sizes) <= 1
    # contiguous, in order
    assert [g for p in parts for g in p.prompts] == batch.prompts
    assert_batches_equal(Batch.concat(parts, pad_token_id=PAD), batch)


def test_split_more_chunks_than_rows_gives_empty_parts_that_concat_ignores():
    batch = make_batch([1, 2], [2, 1])
    parts = batch.split(4)
    assert sorted(len(p) for p in parts) == [0, 0, 1, 1]
    assert_batches_equal(Batch.concat(parts, pad_token_id=PAD), batch)


def test_split_earlier_parts_are_larger_as_documented():
    batch = make_batch([1] * 7, [1] * 7)
    assert [len(p) for p in batch.split(3)] == [3, 2, 2]


def test_concat_repads_prompts_left_and_per_token_fields_right():
    a = make_batch([1, 2], [1, 2])                   # P=2, R=2
    b = make_batch([3], [4], seed=1)                 # P=3, R=4
    out = Batch.concat([a, b], pad_token_id=PAD)
    assert out.prompt_ids.shape == (3, 3) and out.response_ids.shape == (3, 4)
    # a's prompts get one pad column on the LEFT; real tokens stay right-aligned
    assert torch.equal(out.prompt_ids[:2], torch.cat([torch.full((2, 1), PAD), a.prompt_ids], 1))
    assert torch.equal(out.prompt_mask[:2], torch.cat([torch.zeros(2, 1, dtype=torch.long), a.prompt_mask], 1))
    assert out.prompt_mask[:2].tolist() == [[0, 0, 1], [0, 1, 1]]
    # a's responses and per-token fields get two columns on the RIGHT: pad id for ids, 0 elsewhere
    assert torch.equal(out.response_ids[:2], torch.cat([a.response_ids, torch.full((2, 2), PAD)], 1))
    assert out.response_mask[:2].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    for name in ("rollout_log_probs", "old_log_probs", "ref_log_probs", "advantages"):
        got = getattr(out, name)
        assert torch.equal(got[:2], torch.cat([getattr(a, name), torch.zeros(2, 2)], 1)), name
        assert torch.equal(got[2:], getattr(b, name)), name
    # b, the widest part, is unchanged
    assert torch.equal(out.prompt_ids[2:], b.prompt_ids)
    assert torch.equal(out.response_ids[2:], b.response_ids)
    # layout invariant: prompt masks are 0..01..1 (left-padded), response masks 1..10..0 (right-padded)
    assert (out.prompt_mask.diff(dim=1) >= 0).all()
    assert (out.response_mask.diff(dim=1) <= 0).all()
    assert out.scores.tolist() == pytest.approx([0.0, 0.1, 0.0])
    assert out.group_ids.tolist() == [0, 0, 0]
    assert out.prompts == ["prompt 0", "prompt 1", "prompt 0"]
    assert out.rows == [{"answer": "0"}, {"answer": "1"}, {"answer": "0"}]


def test_concat_raises_when_a_field_is_set_in_some_parts_only():
    a = make_batch([1, 2], [1, 2])
    b = make_batch([3], [4]).replace(ref_log_probs=None)
    with pytest.raises(ValueError, match="ref_log_probs"):
        Batch.concat([a, b])


def test_concat_keeps_a_field_unset_in_every_part_unset():
    a = make_batch([1, 2], [1, 2]).replace(advantages=None)
    b = make_batch([3], [4]).replace(advantages=None)
    assert Batch.concat([a, b]).advantages is None


def test_trimmed_removes_all_padding_columns_and_keeps_values():
    # real prompt lengths <= 3 inside width 6, real responses <= 2 inside width 5
    batch = make_batch([3, 1, 2], [2, 1, 2], width_p=6, width_r=5)
    t = batch.trimmed()
    assert t.prompt_ids.shape == (3, 3) and t.prompt_mask.shape == (3, 3)
    assert t.response_ids.shape == (3, 2) and t.response_mask.shape == (3, 2)
    # removed columns were pure padding ...
    assert batch.prompt_mask[:, :3].sum() == 0
    assert batch.response_mask[:, 2:].sum() == 0
    # ... and kept columns are the original values
    assert torch.equal(t.prompt_ids, batch.prompt_ids[:, 3:])
    assert torch.equal(t.prompt_mask, batch.prompt_mask[:, 3:])
    assert torch.equal(t.response_ids, batch.response_ids[:, :2])
    for name in ("rollout_log_probs", "old_log_probs", "ref_log_probs", "advantages"):
        assert torch.equal(getattr(t, name), getattr(batch, name)[:, :2]), name
    assert torch.equal(t.scores, batch.scores) and torch.equal(t.group_ids, batch.group_ids)
    assert t.prompts == batch.prompts and t.rows == batch.rows
    # same real tokens per row
    assert torch.equal(t.input_ids[t.attention_mask.bool()], batch.input_ids[batch.attention_mask.bool()])


def test_trimmed_is_a_no_op_on_a_tight_batch():
    batch = make_batch([3, 1, 2], [2, 1, 2])
    assert_batches_equal(batch.trimmed(), batch)

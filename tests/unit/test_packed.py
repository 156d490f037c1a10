"""Packing a batch without padding (models/packed.py): the layout by hand, and attention within its blocks."""

import torch

from grpoflow.models.attention import grouped_attention
from grpoflow.models.packed import can_pack, pack


def _layout():
    # rows 0 and 1 share prompt A = [5, 6] (left-padded to 3), row 2 has B = [7, 8, 9]; responses of 3, 1, 2 tokens
    prompt_ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1]])
    response_ids = torch.tensor([[11, 12, 13], [14, 0, 0], [15, 16, 0]])
    response_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    return pack(prompt_ids, prompt_mask, response_ids, response_mask, mask_dtype=torch.float32)


def test_layout_by_hand():
    layout = _layout()
    # A, B once, then each response's tokens but its last: row 0 [11, 12], row 1 none, row 2 [15]
    assert layout.input_ids.tolist() == [[5, 6, 7, 8, 9, 11, 12, 15]]
    assert layout.position_ids.tolist() == [[0, 1, 0, 1, 2, 2, 3, 3]]
    # token 0 of a response is predicted by its prompt's last token (A: 1, B: 4), token t by its token t - 1
    assert layout.predict.tolist() == [1, 5, 6, 1, 4, 7]
    prompts, responses = layout.blocks
    assert prompts.queries.tolist() == [[0, 1, 0], [2, 3, 4]]
    assert responses.queries.tolist() == [[5, 6], [0, 0], [7, 0]]
    assert responses.keys.tolist() == [[0, 1, 0, 5, 6], [0, 1, 0, 0, 0], [2, 3, 4, 7, 0]]
    visible = (responses.mask == 0).squeeze(1).int().tolist()
    assert visible[0] == [[1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]  # its prompt, then itself causally
    assert visible[1] == [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0]]  # no real query: key 0 only (finite softmax)
    assert visible[2] == [[1, 1, 1, 1, 0], [1, 0, 0, 0, 0]]
    assert (prompts.mask == 0).squeeze(1).int().tolist()[0] == [[1, 0, 0], [1, 1, 0], [1, 0, 0]]
    # blocks' outputs flattened: prompt rows of 3 (A at 0-1, B at 3-5), then response rows of 2 from 6
    assert layout.out_index.tolist() == [0, 1, 3, 4, 5, 6, 7, 10]


class _Module(torch.nn.Module):
    num_key_value_groups = 2


def test_packed_attention_equals_each_sequence_attended_alone():
    layout = _layout()
    g = torch.Generator().manual_seed(0)
    n = layout.input_ids.shape[1]
    query, key, value = torch.randn(1, 4, n, 3, generator=g), torch.randn(1, 2, n, 3, generator=g), \
        torch.randn(1, 2, n, 3, generator=g)
    out, _ = grouped_attention(_Module(), query, key, value, None, scaling=0.5, packed=layout)
    assert out.shape == (1, n, 4, 3)
    # response row 0's second token (packed 6) reads A (0, 1) and row 0's tokens (5, 6); B's last token (4) reads 2-4
    for token, keys in [(6, [0, 1, 5, 6]), (4, [2, 3, 4]), (7, [2, 3, 4, 7]), (0, [0])]:
        alone, _ = grouped_attention(_Module(), query[:, :, [token]], key[:, :, keys], value[:, :, keys], None,
                                     scaling=0.5)
        torch.testing.assert_close(out[0, token], alone[0, 0])


def test_what_packing_takes():
    prompts = torch.tensor([[0, 1], [1, 1], [0, 1]])
    assert can_pack(prompts, torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]]))
    assert not can_pack(prompts, torch.tensor([[1, 1, 0], [1, 0, 1], [1, 1, 1]]))  # a hole: a token read but dropped
    assert not can_pack(torch.tensor([[0, 1], [0, 0], [1, 1]]), torch.ones(3, 2))  # an empty prompt

"""Batch-invariant kernels (models/exact.py): a row's result does not depend on the rest of its batch."""

import pytest
import torch

from grpoflow.models.attention import grouped_attention
from grpoflow.models.exact import BatchInvariantOps, exact_attention, tiled_linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_product_is_the_same_in_any_batch(dtype):
    # float32 GEMM takes another kernel below 7 rows on this kind of CPU: untiled, 3 rows and 50 differ in the last
    # bits; tiled, every product is [16, K] x [K, N]
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(300, 64, generator=g).to(dtype), torch.randn(50, 64, generator=g).to(dtype)
    assert torch.equal(tiled_linear(x[:3], w), tiled_linear(x, w)[:3])
    assert torch.equal(tiled_linear(x[7:8], w)[0], tiled_linear(x, w)[7])
    torch.testing.assert_close(tiled_linear(x, w), torch.nn.functional.linear(x, w))
    layer = torch.nn.Linear(64, 300).to(dtype)
    with BatchInvariantOps():
        assert torch.equal(layer(x[None, :3])[0], layer(x)[:3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_query_alone_attends_as_in_a_padded_masked_batch(dtype):
    # a decode step (one query per row against its cache) against the trainer's [q, k] block with left padding
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, s, 6, 8, generator=g).to(dtype) for s in (4, 2, 2))
    visible = torch.ones(6, 6, dtype=torch.bool).tril()[None].repeat(2, 1, 1)
    visible[1, :, :2] = False  # row 1: two left-padding positions
    mask = torch.zeros(2, 1, 6, 6, dtype=dtype).masked_fill(~visible[:, None], torch.finfo(dtype).min)
    full, _ = exact_attention(None, q, k, v, mask, 0.35)
    for i in (2, 5):
        one, _ = exact_attention(None, q[:, :, i:i + 1], k[:, :, :i + 1], v[:, :, :i + 1],
                                 mask[:, :, i:i + 1, :i + 1], 0.35)
        assert torch.equal(one[:, 0], full[:, i])
    reference, _ = grouped_attention(torch.nn.Module(), q, k, v, mask, 0.35)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(full[:, 2:].float(), reference[:, 2:].float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_batched_products_slices_are_the_lone_products(dtype):
    # what exact_attention relies on to batch the queries that read as many keys
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(9, 3, 2, 16, generator=g).to(dtype), torch.randn(9, 3, 16, 11, generator=g).to(dtype)
    whole = torch.matmul(a, b)
    assert all(torch.equal(torch.matmul(a[i:i + 1], b[i:i + 1]), whole[i:i + 1]) for i in (0, 4, 8))
    assert torch.equal(torch.matmul(a[:3], b[:3]), whole[:3])

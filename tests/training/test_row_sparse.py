"""RowSparseBag: the same outputs and table gradients as torch's embedding_bag, already coalesced."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from primus_dagster.training.row_sparse import row_sparse_bag, row_sums, sorted_row_sums
from primus_dagster.training.trainer import coalesced_rows


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 49), max_size=40), st.sampled_from([50, 50 * 41]))
def test_row_sums_are_coalesce_s_rows(ids: list[int], n_rows: int) -> None:
    """Both paths (the presence mask of a small table, the sort of a large one) give coalesce's rows and sums."""
    x = torch.tensor(ids, dtype=torch.int64)
    values = torch.randn(len(ids), 3, generator=torch.Generator().manual_seed(len(ids)))
    want = torch.sparse_coo_tensor(x.unsqueeze(0), values, (n_rows, 3), check_invariants=True).coalesce()
    for rows, sums in (row_sums(x, values, n_rows), sorted_row_sums(x, values)):
        assert torch.equal(rows, want.indices()[0])
        torch.testing.assert_close(sums, want.values())
    assert torch.equal(sorted_row_sums(x, values)[1], want.values())  # the sort path: bit for bit


def _jagged(seed: int, bags: int, max_len: int, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (bags,), generator=g)
    lengths[0] = 0  # an empty bag
    ids = torch.randint(0, n_rows, (int(lengths.sum()),), generator=g)
    return ids, torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)[:-1]])


@pytest.mark.parametrize("n_rows", [30, 100_000])  # the mask path and the sort path (COUNTING_ROWS_PER_ID)
@pytest.mark.parametrize("mode", ["sum", "mean", "weighted"])
def test_pooled_output_and_gradient_match_embedding_bag(n_rows: int, mode: str) -> None:
    ids, offsets = _jagged(seed=1, bags=64, max_len=9, n_rows=min(n_rows, 30))
    weights = torch.rand(len(ids), generator=torch.Generator().manual_seed(2)) if mode == "weighted" else None
    torch_mode = "sum" if mode == "weighted" else mode
    base = torch.randn(n_rows, 4, generator=torch.Generator().manual_seed(3))
    ours_w, ref_w = base.clone().requires_grad_(), base.clone().requires_grad_()
    upstream = torch.randn(64, 4, generator=torch.Generator().manual_seed(4))

    ours = row_sparse_bag(ours_w, ids, offsets, torch_mode, weights)
    ref = F.embedding_bag(ids, ref_w, offsets, mode=torch_mode, per_sample_weights=weights, sparse=True)
    torch.testing.assert_close(ours, ref)
    (ours * upstream).sum().backward()
    (ref * upstream).sum().backward()
    assert ours_w.grad is not None and ref_w.grad is not None
    want = ref_w.grad.coalesce()
    rows, values = ours_w.grad._indices()[0], ours_w.grad._values()
    assert torch.equal(rows, want.indices()[0])  # one row per touched bucket, ascending: no coalesce needed
    torch.testing.assert_close(values, want.values())
    got_rows, got_values = coalesced_rows(ours_w.grad)  # what the optimizer and the exchange read
    assert got_rows.data_ptr() == rows.data_ptr() and got_values.data_ptr() == values.data_ptr()


def test_plain_lookup_and_a_table_used_twice() -> None:
    """offsets None is nn.Embedding's lookup; two lookups of one table add their coalesced gradients."""
    weight = torch.randn(20, 3, requires_grad=True)
    ids = torch.tensor([[1, 5], [5, 19]])
    out = row_sparse_bag(weight, ids).reshape(2, 6)
    torch.testing.assert_close(out, F.embedding(ids, weight.detach()).reshape(2, 6))
    (out.sum() + row_sparse_bag(weight, torch.tensor([5, 7])).sum()).backward()
    assert weight.grad is not None
    dense = weight.grad.to_dense()
    assert dense[5].tolist() == [3.0, 3.0, 3.0]  # twice in the first lookup, once in the second
    assert dense[[1, 7, 19]].eq(1.0).all() and dense.abs().sum() == 3 * 6

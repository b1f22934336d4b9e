"""Hashed embedding tables: the id hash in range, deterministic for any int64, spread per feature."""

from __future__ import annotations

import pytest
import torch

from primus_dagster.training.models import HashedEmbedding


def test_hash_in_range_and_deterministic_for_any_int64() -> None:
    emb = HashedEmbedding(n_features=3, buckets=97, dim=4)
    info = torch.iinfo(torch.int64)
    ids = torch.tensor([[0, -1, info.min], [info.max, 2**40, -(2**40)], [123, -123, 7]])
    ids = torch.cat([ids, torch.randint(info.min, info.max, (500, 3))])
    buckets = emb.bucket_ids(ids)
    assert buckets.dtype == torch.int64 and buckets.shape == ids.shape
    assert int(buckets.min()) >= 0 and int(buckets.max()) < 97
    assert torch.equal(buckets, HashedEmbedding(3, 97, 4).bucket_ids(ids))  # salts do not depend on any RNG
    assert emb(ids).shape == (503, 12)


def test_hash_spreads_ids_and_salts_differ_per_feature() -> None:
    emb = HashedEmbedding(n_features=4, buckets=1000, dim=2)
    ids = torch.arange(-5000, 5000).unsqueeze(1).repeat(1, 4)
    buckets = emb.bucket_ids(ids)
    for f in range(4):
        assert len(torch.unique(buckets[:, f])) > 990  # 10k consecutive ids cover the table
    for f in range(1, 4):
        assert (buckets[:, f] != buckets[:, 0]).float().mean() > 0.99  # same id, other feature -> other bucket
    # distinct ids rarely collide when the table is large
    big = HashedEmbedding(1, 1_000_000, 1).bucket_ids(torch.arange(0, 1000).unsqueeze(1))
    assert len(torch.unique(big)) >= 995


def test_hash_rejects_wrong_width() -> None:
    with pytest.raises(ValueError, match=r"\[B, 3\]"):
        HashedEmbedding(3, 10, 2)(torch.zeros(4, 2, dtype=torch.int64))

"""The speed-ups of the training path change no result: LazyAdam == torch.optim.SparseAdam bit for bit, and the
one-limb hash == the three-limb hash, and tables on huge pages hold the same values."""

from __future__ import annotations

import io
import mmap

import pytest
import torch
from torch import nn

from primus_dagster.data import Batch
from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.training.models import (
    HASH_LIMBS,
    HASH_PRIME,
    HashedEmbedding,
    build_model,
    huge_page_copy,
    huge_page_zeros,
)
from primus_dagster.training.trainer import LazyAdam, Trainer, coalesced_rows


def three_limb_buckets(emb: HashedEmbedding, sparse: torch.Tensor) -> torch.Tensor:
    """The hash as documented, limb by limb (the path every id took before the fast path)."""
    h = emb.salts[3].expand_as(sparse)
    for k, (shift, bits) in enumerate(HASH_LIMBS):
        h = h + torch.bitwise_and(sparse >> shift, (1 << bits) - 1) * emb.salts[k]
    return torch.remainder(torch.remainder(h, HASH_PRIME), emb.buckets)


@pytest.mark.parametrize(
    "ids",
    [
        [[0, 1, 2, (1 << 22) - 1]],  # all in [0, 2^22): the one-limb path
        [[0, 1, 2, 1 << 22]],  # one id past it: the three-limb path
        [[7, -3, 2**40, -(2**63)]],
        [[5, 6, 7, 8], [2**62, -1, 0, 123456]],
    ],
)
def test_bucket_ids_equal_the_three_limb_hash(ids: list[list[int]]) -> None:
    emb = HashedEmbedding(n_features=4, buckets=1009, dim=2)
    sparse = torch.tensor(ids, dtype=torch.int64)
    assert torch.equal(emb.bucket_ids(sparse), three_limb_buckets(emb, sparse))


def test_bucket_ids_of_random_ids_and_of_no_rows() -> None:
    emb = HashedEmbedding(n_features=26, buckets=260_000, dim=4)
    g = torch.Generator().manual_seed(0)
    for high in (10_000, 1 << 22, 1 << 40):
        sparse = torch.randint(0, high, (512, 26), generator=g)
        assert torch.equal(emb.bucket_ids(sparse), three_limb_buckets(emb, sparse))
    empty = torch.zeros((0, 26), dtype=torch.int64)
    assert emb.bucket_ids(empty).shape == (0, 26)


def sparse_steps(opt_cls: type, dim: int, steps: int = 6, *, maximize: bool = False, coalesce: bool = False) -> list:
    """Train one sparse embedding table with ``opt_cls``; its weight, exp_avg and exp_avg_sq after."""
    g = torch.Generator().manual_seed(3)
    table = nn.Embedding(300, dim, sparse=True)
    with torch.no_grad():
        table.weight.copy_(torch.randn(300, dim, generator=g))
    opt = opt_cls([table.weight], lr=0.01, maximize=maximize)
    for _ in range(steps):
        ids = torch.randint(0, 60, (200,), generator=g)  # many duplicate ids: the coalescing matters
        target = torch.randn(200, dim, generator=g)
        opt.zero_grad()
        ((table(ids) - target) ** 3).sum().backward()
        if coalesce:
            table.weight.grad = table.weight.grad.coalesce()
        opt.step()
    state = opt.state[table.weight]
    return [table.weight.detach(), state["exp_avg"], state["exp_avg_sq"], state["step"]]


@pytest.mark.parametrize("dim", [16, 6])  # 16: rows copied as 16-byte words; 6: the plain index_copy_
@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("coalesce", [False, True])
def test_lazy_adam_is_sparse_adam_bit_for_bit(dim: int, maximize: bool, coalesce: bool) -> None:
    ours = sparse_steps(LazyAdam, dim, maximize=maximize, coalesce=coalesce)
    ref = sparse_steps(torch.optim.SparseAdam, dim, maximize=maximize, coalesce=coalesce)
    assert ours[3] == ref[3]
    for a, b in zip(ours[:3], ref[:3], strict=True):
        assert torch.equal(a, b)
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))  # the same bits, signed zeros too


def test_lazy_adam_continues_from_a_sparse_adam_state() -> None:
    """A SparseAdam state_dict loads into LazyAdam (and back): the same keys, the same tensors."""
    g = torch.Generator().manual_seed(4)
    tables = [nn.Embedding(50, 8, sparse=True) for _ in range(2)]
    tables[1].load_state_dict(tables[0].state_dict())
    opts = [torch.optim.SparseAdam([tables[0].weight]), torch.optim.SparseAdam([tables[1].weight])]
    for step in range(6):
        ids = torch.randint(0, 20, (40,), generator=g)
        for table, opt in zip(tables, opts, strict=True):
            opt.zero_grad()
            table(ids).square().sum().backward()
            opt.step()
        if step == 2:  # switch the second table to LazyAdam mid-way
            lazy = LazyAdam([tables[1].weight])
            lazy.load_state_dict(opts[1].state_dict())
            opts[1] = lazy
    assert torch.equal(tables[0].weight, tables[1].weight)
    assert set(opts[1].state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}


def batches(rows: int = 96, n: int = 6) -> list[Batch]:
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(n):
        dense = torch.randn(rows, 3, generator=g)
        sparse = torch.randint(-50, 50, (rows, 4), generator=g)
        label = (torch.rand(rows, generator=g) < 0.3).float()
        out.append(Batch.from_tensors(dense, sparse, label, kind="batch" if i % 2 == 0 else "stream"))
    return out


@pytest.mark.parametrize("model_type", ["single", "mtrm"])
def test_trainer_steps_equal_those_with_torch_sparse_adam(model_type: str) -> None:
    """Whole trainer steps (MTRM: one tower's table without a gradient each step) give the same model."""
    spec = TrainingSpec(
        mode="mixed",
        batch_size=96,
        learning_rate=0.01,
        model=ModelSpec(type=model_type, embedding_dim=8, hash_buckets=64, memory_hidden=[8], adapt_hidden=[8]),
    )
    trainers = [Trainer(build_model(spec.model, 3, 4, seed=1), spec) for _ in range(2)]
    sparse_part = trainers[1].optimizer.parts["sparse"]
    assert isinstance(trainers[0].optimizer.parts["sparse"], LazyAdam)
    trainers[1].optimizer.parts["sparse"] = torch.optim.SparseAdam(sparse_part.param_groups[0]["params"], lr=0.01)
    for batch in batches():
        losses = [trainer.train_step(batch) for trainer in trainers]
        assert losses[0] == losses[1]
    for a, b in zip(trainers[0].model.state_dict().values(), trainers[1].model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("nnz", [1, 200, 5000, 53_248])  # small sorts and the large (radix) one
def testcoalesced_rows_equal_coalesce(nnz: int) -> None:
    g = torch.Generator().manual_seed(nnz)
    ids = torch.randint(0, max(2, nnz // 3), (nnz,), generator=g)
    values = torch.randn(nnz, 16, generator=g) ** 3
    grad = torch.sparse_coo_tensor(ids.unsqueeze(0), values, (max(2, nnz // 3), 16), check_invariants=True)
    rows, summed = coalesced_rows(grad)
    reference = grad.coalesce()
    assert torch.equal(rows, reference._indices()[0])
    assert torch.equal(summed.view(torch.int32), reference._values().view(torch.int32))


def test_huge_page_tables_are_zeros_aligned_and_writable() -> None:
    big = huge_page_zeros((40_000, 16))  # 2.56 MB
    assert big.shape == (40_000, 16) and big.dtype == torch.float32 and not big.any()
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert big.data_ptr() % (2 << 20) == 0
    big[123] = 1.0
    assert float(big.sum()) == 16.0
    small = huge_page_zeros((10, 16))
    assert small.shape == (10, 16) and not small.any()
    copy = huge_page_copy(torch.arange(40_000 * 16, dtype=torch.float32).view(40_000, 16))
    assert torch.equal(copy, torch.arange(40_000 * 16, dtype=torch.float32).view(40_000, 16))


def test_a_restored_large_table_trains_on_as_before() -> None:
    """Optimizer state saved and loaded (re-homed on 2 MB pages) continues bit for bit."""
    g = torch.Generator().manual_seed(5)
    tables = [nn.Embedding(40_000, 16, sparse=True) for _ in range(2)]
    tables[1].load_state_dict(tables[0].state_dict())
    opts = [LazyAdam([t.weight]) for t in tables]
    for step in range(4):
        ids = torch.randint(0, 40_000, (3000,), generator=g)
        for table, opt in zip(tables, opts, strict=True):
            opt.zero_grad()
            table(ids).square().sum().backward()
            opt.step()
        if step == 1:
            buffer = io.BytesIO()
            torch.save(opts[1].state_dict(), buffer)
            buffer.seek(0)
            opts[1] = LazyAdam([tables[1].weight])
            opts[1].load_state_dict(torch.load(buffer))
    assert torch.equal(tables[0].weight, tables[1].weight)

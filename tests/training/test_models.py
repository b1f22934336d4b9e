"""Models: hashing, shapes, deterministic building, MTRM gradient routing, learnability."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.metrics import auc
from primus_dagster.training.models import MTRM, HashedEmbedding, SingleTower, build_model, model_summary
from primus_dagster.training.trainer import RecOptimizer

SMALL = dict(embedding_dim=4, hash_buckets=997, memory_hidden=[16, 8], adapt_hidden=[16, 8])


def inputs(b: int = 32, n_dense: int = 3, n_sparse: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, n_dense, generator=g), torch.randint(-1000, 1000, (b, n_sparse), generator=g)


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


@pytest.mark.parametrize("kind", ["single", "mtrm"])
def test_output_shapes(kind: str) -> None:
    model = build_model(ModelSpec(type=kind, **SMALL), n_dense=3, n_sparse=2)
    dense, sparse = inputs(32)
    assert (model.n_dense, model.n_sparse) == (3, 2)
    for k in ("batch", "stream"):
        out = model(dense, sparse, k)
        assert out.shape == (32,) and out.dtype == torch.float32
    assert model.predict(dense, sparse).shape == (32,)
    with pytest.raises(ValueError, match="dense must be"):
        model(dense[:, :2], sparse, "batch")


def test_default_spec_shapes_and_summary() -> None:
    model = build_model(ModelSpec(), n_dense=13, n_sparse=5)
    assert isinstance(model, MTRM)
    dense, sparse = inputs(8, 13, 5)
    state = model.memory_state(dense, sparse)
    assert state.shape == (8, 32 + 5 * 16)  # h_mem ++ the memory tower's 5 embeddings
    assert torch.equal(state[:, 32:], model.memory.embedding(sparse))  # they are its own embeddings
    summary = model_summary(model)
    assert summary["type"] == "mtrm" and summary["params"] == summary["memory_params"] + summary["adapt_params"]
    assert summary["memory_params"] > 100_000 * 16  # its own embedding table
    single = model_summary(build_model(ModelSpec(type="single"), 13, 5))
    assert single["type"] == "single" and single["params"] > 100_000 * 16


def test_single_tower_ignores_kind() -> None:
    model = build_model(ModelSpec(type="single", **SMALL), 3, 2)
    assert isinstance(model, SingleTower)
    dense, sparse = inputs()
    assert torch.equal(model(dense, sparse, "batch"), model(dense, sparse, "stream"))
    assert torch.equal(model(dense, sparse, "batch"), model.predict(dense, sparse))


def test_only_dense_or_only_sparse_inputs() -> None:
    for n_dense, n_sparse in ((3, 0), (0, 2)):
        for kind in ("single", "mtrm"):
            model = build_model(ModelSpec(type=kind, **SMALL), n_dense, n_sparse)
            dense, sparse = inputs(5, n_dense, n_sparse)
            assert model(dense, sparse, "stream").shape == (5,)


@pytest.mark.parametrize("kind", ["single", "mtrm"])
def test_build_is_deterministic_and_leaves_global_rng_alone(kind: str) -> None:
    spec = ModelSpec(type=kind, **SMALL)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = build_model(spec, 3, 2, seed=7), build_model(spec, 3, 2, seed=7), build_model(spec, 3, 2, seed=8)
    assert torch.equal(torch.rand(3), expected)  # building did not consume the global generator
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_mtrm_rejects_unknown_kind() -> None:
    model = build_model(ModelSpec(type="mtrm", **SMALL), 3, 2)
    with pytest.raises(ValueError, match="'replay'"):
        model(*inputs(), "replay")


def _grads(module: torch.nn.Module) -> dict[str, bool]:
    """name -> whether the parameter received a non-zero gradient."""
    return {n: p.grad is not None and bool(p.grad.abs().sum() > 0) for n, p in module.named_parameters()}


def test_mtrm_gradients_are_routed_by_kind() -> None:
    model = build_model(ModelSpec(type="mtrm", **SMALL), n_dense=3, n_sparse=2, seed=1)
    dense, sparse = inputs(64)
    labels = torch.randint(0, 2, (64,), generator=torch.Generator().manual_seed(2)).float()

    F.binary_cross_entropy_with_logits(model(dense, sparse, "stream"), labels).backward()
    memory, adapt = _grads(model.memory), _grads(model.adapt)
    assert {"embedding.tables.shared.table.weight", "mlp.0.weight", "head.weight"} <= memory.keys()
    assert not any(memory.values()), f"stream loss reached the memory tower: {memory}"
    assert all(adapt.values()), f"adapt parameters without gradient: {adapt}"
    assert all(p.grad is None for p in model.memory.parameters())  # Adam skips them entirely

    model.zero_grad(set_to_none=True)
    F.binary_cross_entropy_with_logits(model(dense, sparse, "batch"), labels).backward()
    memory, adapt = _grads(model.memory), _grads(model.adapt)
    assert all(memory.values()), f"memory parameters without gradient: {memory}"
    assert not any(adapt.values()), f"batch loss reached the adapt tower: {adapt}"

    # serving uses the adapt tower, on the memory tower's current state
    assert torch.equal(model.predict(dense, sparse), model(dense, sparse, "stream"))
    assert not model.memory_state(dense, sparse).requires_grad


def _fit(model: torch.nn.Module, kinds: tuple[str, ...], steps: int = 150) -> None:
    g = torch.Generator().manual_seed(0)
    opt = RecOptimizer(model, lr=0.01)  # Adam + SparseAdam for the (sparse-gradient) embedding tables
    for step in range(steps):
        dense = torch.randn(256, 3, generator=g)
        sparse = torch.randint(0, 50, (256, 2), generator=g)
        label = ((dense[:, 0] > 0) ^ (sparse[:, 1] % 2 == 1)).float()  # a dense and an id-based signal
        opt.zero_grad(set_to_none=True)
        F.binary_cross_entropy_with_logits(model(dense, sparse, kinds[step % len(kinds)]), label).backward()
        opt.step()


@pytest.mark.parametrize("kind", ["single", "mtrm"])
def test_models_learn_a_separable_signal(kind: str) -> None:
    model = build_model(ModelSpec(type=kind, **SMALL), n_dense=3, n_sparse=2, seed=0)
    _fit(model, ("batch", "stream"), steps=300)
    g = torch.Generator().manual_seed(99)
    dense, sparse = torch.randn(2000, 3, generator=g), torch.randint(0, 50, (2000, 2), generator=g)
    label = (dense[:, 0] > 0) ^ (sparse[:, 1] % 2 == 1)
    with torch.no_grad():
        assert auc(label, model.predict(dense, sparse)) > 0.9
        if kind == "mtrm":
            assert auc(label, model(dense, sparse, "batch")) > 0.9  # the memory tower learned too


def test_mtrm_calibrates_its_serving_output_for_the_streams_missing_labels() -> None:
    # the paper's split (the adapt tower learns the stream alone): its rate is the stream's
    model = build_model(ModelSpec(type="mtrm", adapt_batch_weight=0.0, **SMALL), n_dense=3, n_sparse=2, seed=0)
    dense, sparse = torch.randn(8, 3), torch.randint(0, 50, (8, 2))
    raw = model(dense, sparse, "stream").detach()
    model.observe("batch", torch.tensor([1.0] * 100 + [0.0] * 900))  # complete labels: 10 % positive
    assert model.delay_offset() == 0.0  # not enough of both kinds yet
    model.observe("stream", torch.tensor([1.0] * 50 + [0.0] * 950))  # late clicks missing: 5 %
    expected = math.log(0.1 / 0.9) - math.log(0.05 / 0.95)
    assert model.delay_offset() == pytest.approx(expected)
    assert torch.allclose(model.predict(dense, sparse), raw + expected, atol=1e-6)  # a shift: AUC unchanged
    again = build_model(ModelSpec(type="mtrm", adapt_batch_weight=0.0, **SMALL), n_dense=3, n_sparse=2, seed=0)
    again.load_state_dict(model.state_dict())  # the counts travel with checkpoints
    assert again.delay_offset() == pytest.approx(expected)

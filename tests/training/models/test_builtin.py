"""The built-in models: shapes, the single tower ignoring kind, MTRM gradient routing and calibration,
learnability."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.metrics import auc
from primus_dagster.training.models import SingleTower, build_model
from primus_dagster.training.trainer import RecOptimizer

SMALL = dict(embedding_dim=4, hash_buckets=997, memory_hidden=[16, 8], adapt_hidden=[16, 8])


def inputs(b: int = 32, n_dense: int = 3, n_sparse: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, n_dense, generator=g), torch.randint(-1000, 1000, (b, n_sparse), generator=g)


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

"""``training.model.adapt_batch_weight``: a batch sample also trains MTRM's adapt tower, never the
memory tower through it (``h_aux`` stays detached)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from test_trainer import SMALL, batch
from test_trainer_tower_lr import step_deltas

from primus_dagster.spec import parse_job_spec
from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.models import build_model, model_inputs
from tests.speckit import one_source_spec


def test_adapt_batch_weight_is_validated_and_only_for_mtrm() -> None:
    assert ModelSpec(type="mtrm").adapt_batch_weight == 0.1  # chosen on the quality bench's tuning seeds
    assert ModelSpec(type="single").adapt_batch_weight == 0.1  # the default is harmless on a single tower
    with pytest.raises(ValidationError, match="adapt_batch_weight applies to the MTRM"):
        ModelSpec(type="single", adapt_batch_weight=0.5)
    for bad in (-0.1, 101.0):
        with pytest.raises(ValidationError, match="adapt_batch_weight"):
            ModelSpec(type="mtrm", adapt_batch_weight=bad)


def test_a_batch_step_trains_the_adapt_tower_only_with_a_weight() -> None:
    off, on = step_deltas("batch", adapt_batch_weight=0.0), step_deltas("batch", adapt_batch_weight=0.25)
    adapt = [n for n in on if n.startswith("adapt.")]
    assert adapt and all(not bool(off[n].any()) for n in adapt)  # the paper's split: stream only
    assert all(bool(on[n].abs().sum() > 0) for n in adapt)
    for name in (n for n in on if n.startswith("memory.")):  # the memory tower's step is unchanged
        assert torch.equal(on[name], off[name]), name
    off = step_deltas("stream", adapt_batch_weight=0.0)
    on = step_deltas("stream", adapt_batch_weight=0.25)  # a stream step is the same either way
    for name, delta in off.items():
        assert torch.equal(on[name], delta), name


def test_the_adapt_loss_on_batch_samples_leaves_the_memory_tower_without_gradient() -> None:
    model = build_model(ModelSpec(adapt_batch_weight=0.5, **SMALL), 3, 2, seed=1)
    dense, sparse, label = model_inputs(batch("batch"))
    loss = model.auxiliary_loss(dense, sparse, "batch", label)
    assert loss is not None
    expected = 0.5 * F.binary_cross_entropy_with_logits(model(dense, sparse, "stream"), label)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert all(p.grad is None for n, p in model.named_parameters() if n.startswith("memory."))
    assert all(p.grad is not None for n, p in model.named_parameters() if n.startswith("adapt."))
    assert model.auxiliary_loss(dense, sparse, "stream", label) is None


def test_the_calibration_uses_the_rate_of_the_labels_the_adapt_tower_learnt() -> None:
    model = build_model(ModelSpec(adapt_batch_weight=0.5, **SMALL), 3, 2)
    model.observe("batch", torch.tensor([1.0] * 100 + [0.0] * 1900))  # rate 0.05
    model.observe("stream", torch.tensor([1.0] * 60 + [0.0] * 1940))  # rate 0.03
    adapt_rate = (60 + 0.5 * 100) / (2000 + 0.5 * 2000)

    def logit(p: float) -> float:
        return float(torch.logit(torch.tensor(p, dtype=torch.float64)))

    assert model.delay_offset() == pytest.approx(logit(0.05) - logit(adapt_rate))
    model.spec = model.spec.model_copy(update={"adapt_batch_weight": 0.0})
    assert model.delay_offset() == pytest.approx(logit(0.05) - logit(0.03))


def test_a_multi_trainer_spec_with_a_weight_is_valid() -> None:
    pools = "pools: {training: {replicas: 2, max_replicas: 2}}\n"
    # the default model type (mtrm) on a one-source spec: advised against, still valid
    training = "training: {model: {adapt_batch_weight: 0.25}, mode: batch_then_stream}\n"
    assert parse_job_spec(one_source_spec("abw", pools, training)).training.model.adapt_batch_weight == 0.25


@pytest.mark.parametrize("weight", [0.0, 0.25])
def test_the_exchange_carries_a_batch_ranks_adapt_gradients_with_a_weight(weight: float) -> None:
    """Two ranks' messages of one round, one batch and one stream micro-batch, applied on a third
    replica: its adapt tower gets the mean of both ranks' adapt gradients (with a weight) or the stream
    rank's alone (without); the memory tower the batch rank's."""
    from primus_dagster.spec.job import TrainingSpec
    from primus_dagster.training.distributed.exchange import MAX_TABLES, STATUS_FIELDS, RowSparseExchange
    from primus_dagster.training.trainer import Trainer

    spec = TrainingSpec(mode="mixed", batch_size=64, model=ModelSpec(type="mtrm", adapt_batch_weight=weight, **SMALL))
    ranks = [Trainer(build_model(spec.model, 3, 2), spec) for _ in range(3)]
    exchanges = [RowSparseExchange(t.model) for t in ranks]
    messages, grads = [], []
    for rank, kind in ((0, "batch"), (1, "stream")):
        micro = batch(kind)
        ranks[rank].backward(micro)
        grads.append({n: p.grad for n, p in ranks[rank].model.named_parameters() if n.startswith("adapt.head")})
        status = torch.zeros(STATUS_FIELDS + MAX_TABLES, dtype=torch.float64)
        status[:STATUS_FIELDS] = torch.tensor([1, 0, ("batch", "stream").index(kind), 3, 2, 0, micro.rows])
        messages.append(exchanges[rank].pack(status, int(status[2])))
    adapt_ranks = 2 if weight else 1
    exchanges[2].apply(messages, {"memory": 1, "adapt": adapt_ranks, "all": 2})
    applied = dict(ranks[2].model.named_parameters())
    for name in grads[1]:
        from_batch = grads[0][name] if weight else None
        expected = grads[1][name] if from_batch is None else (from_batch + grads[1][name]) / 2
        assert torch.allclose(applied[name].grad, expected), name
    assert (grads[0]["adapt.head.weight"] is not None) == bool(weight)  # the batch rank trained it only with w

"""``training.model.adapt_batch_weight``: a batch sample also trains MTRM's adapt tower, never the
memory tower through it (``h_aux`` stays detached)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from test_trainer import SMALL, batch
from test_trainer_tower_lr import step_deltas

from primus_dagster.spec import SpecError, parse_job_spec
from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.models import build_model, model_inputs
from tests.speckit import one_source_spec


def test_adapt_batch_weight_is_validated_and_only_for_mtrm() -> None:
    assert ModelSpec(type="mtrm").adapt_batch_weight == 0.0
    assert ModelSpec(type="single").adapt_batch_weight == 0.0  # the default is harmless on a single tower
    with pytest.raises(ValidationError, match="adapt_batch_weight applies to the MTRM"):
        ModelSpec(type="single", adapt_batch_weight=0.25)
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


def test_a_multi_trainer_spec_with_a_weight_is_refused_at_validation() -> None:
    def text(replicas: int) -> str:
        pools = f"pools: {{training: {{replicas: {replicas}, max_replicas: 2}}}}\n"
        training = "training: {model: {type: mtrm, adapt_batch_weight: 0.25}, mode: batch_then_stream}\n"
        return one_source_spec("abw", pools, training)

    assert parse_job_spec(text(1)).training.model.adapt_batch_weight == 0.25
    with pytest.raises(SpecError, match=r"adapt_batch_weight needs one trainer, pools\.training\.replicas is 2"):
        parse_job_spec(text(2))

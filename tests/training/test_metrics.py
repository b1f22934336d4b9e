"""Metrics: AUC / log loss by hand, and evaluate() over batches of a synthetic canonical hour."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from primus_dagster.data import Batch, Normalizer
from primus_dagster.spec import load_job_spec
from primus_dagster.spec.job import ModelSpec
from primus_dagster.synth import SyntheticWorld, WorldConfig
from primus_dagster.training.metrics import EvalResult, auc, evaluate, log_loss
from primus_dagster.training.models import build_model

SMALL = dict(embedding_dim=4, hash_buckets=997, memory_hidden=[16, 8], adapt_hidden=[16, 8])


@pytest.fixture(scope="module")
def features() -> Batch:
    job = load_job_spec("examples/job.yaml")
    hour = SyntheticWorld(WorldConfig(seed=1, rows_per_hour=1000), job.dataset.start).hour(0)
    canonical = Normalizer(job.dataset.source("impressions_parquet"))(hour.combine_chunks().to_batches()[0])
    return Batch.from_arrow(canonical)


def chunks(f: Batch, size: int) -> Iterator[Batch]:
    for start in range(0, f.rows, size):
        yield f.slice(start, start + size)


def test_auc_by_hand() -> None:
    # positive/negative pairs: (0.35 > 0.1), (0.35 < 0.4), (0.8 > 0.1), (0.8 > 0.4) -> 3/4
    assert auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert auc(np.array([1.0, 0.0]), torch.tensor([0.9, 0.2])) == 1.0
    assert auc(torch.tensor([0.0, 1.0, 0.0, 1.0]), torch.tensor([0.5, 0.5, 0.5, 0.5])) == 0.5  # ties


def test_auc_is_nan_for_one_class() -> None:
    assert math.isnan(auc([1, 1, 1], [0.2, 0.3, 0.4]))
    assert math.isnan(auc(np.zeros(5), np.arange(5)))
    assert math.isnan(auc([], []))


def test_log_loss_by_hand_and_clipped() -> None:
    assert log_loss([1, 0], [0.8, 0.4]) == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2)
    assert log_loss(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == pytest.approx(-math.log(1e-7), rel=1e-6)
    assert log_loss([1, 0], [1.0, 0.0]) == pytest.approx(-math.log(1 - 1e-7), rel=1e-3)
    with pytest.raises(ValueError, match="differ in length"):
        log_loss([1, 0], [0.5])


@pytest.mark.parametrize("kind", ["single", "mtrm"])
def test_evaluate_over_synthetic_hour(features: Batch, kind: str) -> None:
    model = build_model(
        ModelSpec(type=kind, **SMALL), n_dense=features.dense.shape[1], n_sparse=features.sparse.shape[1], seed=3
    )
    model.train()
    result = evaluate(model, chunks(features, 256))
    assert model.training  # the previous mode is restored

    positives = int(features.label.sum())
    assert (result.rows, result.positives) == (features.rows, positives) and 0 < positives < features.rows
    assert result.ctr == pytest.approx(positives / features.rows)
    model.eval()
    with torch.no_grad():
        probs = torch.sigmoid(model.predict(features.dense, features.sparse))
    assert result.auc == pytest.approx(auc(features.label, probs))
    assert result.log_loss == pytest.approx(log_loss(features.label, probs), rel=1e-5)
    assert 0.0 <= result.auc <= 1.0 and result.log_loss > 0
    assert evaluate(model, [features]).to_dict() == pytest.approx(result.to_dict(), rel=1e-5)
    assert not model.training  # eval mode stays eval


def test_evaluate_max_rows_stops_early(features: Batch) -> None:
    model = build_model(ModelSpec(type="single", **SMALL), features.dense.shape[1], features.sparse.shape[1])
    pulled: list[int] = []

    def tracked() -> Iterator[Batch]:
        for i, f in enumerate(chunks(features, 100)):
            pulled.append(i)
            yield f

    result = evaluate(model, tracked(), max_rows=250)
    assert result.rows == 250 and pulled == [0, 1, 2]  # the third chunk is sliced, a fourth is never pulled
    assert result.positives == int(features.label[:250].sum())
    assert isinstance(result, EvalResult) and set(result.to_dict()) == {"auc", "log_loss", "rows", "positives", "ctr"}


def test_evaluate_without_rows_raises(features: Batch) -> None:
    model = build_model(ModelSpec(type="mtrm", **SMALL), features.dense.shape[1], features.sparse.shape[1])
    with pytest.raises(ValueError, match="no evaluation rows"):
        evaluate(model, [])
    with pytest.raises(ValueError, match="no evaluation rows"):
        evaluate(model, [features.slice(0, 0)])
    with pytest.raises(ValueError, match="no evaluation rows"):
        evaluate(model, [features], max_rows=0)

"""Declared features: the layout, the dense transforms and their statistics, per-feature tables and
pooled list features through the models, the row-sparse optimiser and checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F
from pydantic import TypeAdapter

from primus_dagster.data import Batch
from primus_dagster.data.batch import Jagged
from primus_dagster.data.canonical import Normalizer
from primus_dagster.data.hashing import stable_hash64
from primus_dagster.spec.features import FeaturesSpec
from primus_dagster.spec.job import ModelSpec, TrainingSpec
from primus_dagster.spec.sources import SourceSpec
from primus_dagster.training.features import FeatureLayout, ModelInit, fit_dense_stats
from primus_dagster.training.models import build_model
from primus_dagster.training.trainer import Trainer

SourceSpecAdapter: TypeAdapter = TypeAdapter(SourceSpec)


def training(**features: object) -> TrainingSpec:
    return TrainingSpec(
        mode="batch", model=ModelSpec(type="single", hash_buckets=1000, embedding_dim=4), features=features
    )


def test_undeclared_columns_take_the_defaults_and_declared_ones_their_tables() -> None:
    spec = training(
        dense=[{"name": "price", "transform": "log1p", "fill": 0}],
        categorical=[{"name": "user", "buckets": 5000, "dim": 8}, {"name": "gender", "table": "profile"}],
        categorical_list=[{"name": "genres", "pooling": "sum"}],
        tables={"profile": {"buckets": 64, "dim": 2}},
    )
    layout = FeatureLayout.resolve(spec, ["price", "age"], ["user", "gender", "item"], ["genres"])
    assert [(c.name, c.transform, c.fill) for c in layout.dense] == [
        ("price", "log1p", 0.0),
        ("age", "standardize", None),
    ]
    assert [(c.name, c.table) for c in layout.sparse] == [("user", "user"), ("gender", "profile"), ("item", "shared")]
    assert layout.lists[0].pooling == "sum" and layout.lists[0].table == "shared"
    assert layout.tables == {"user": (5000, 8), "profile": (64, 2), "shared": (1000, 4)}
    assert layout.embedding_width() == 8 + 2 + 4 + 4
    assert FeatureLayout.from_dict(layout.to_dict()) == layout


def test_a_table_that_is_not_declared_is_named() -> None:
    with pytest.raises(ValueError, match=r"table 'nope' is not declared in training.features.tables"):
        FeaturesSpec(categorical=[{"name": "u", "table": "nope"}])
    with pytest.raises(ValueError, match="needs both buckets and dim"):
        FeaturesSpec(categorical=[{"name": "u", "buckets": 100}])


def test_dense_statistics_and_transforms() -> None:
    spec = training(
        dense=[
            {"name": "a"},
            {"name": "b", "transform": "log1p"},
            {"name": "c", "transform": "clip"},
            {"name": "d", "transform": "none", "fill": 7},
        ]
    )
    layout = FeatureLayout.resolve(spec, ["a", "b", "c", "d"], ["s"], [])
    rng = np.random.default_rng(0)
    raw = np.stack(
        [
            rng.normal(100.0, 20.0, 4000),
            rng.lognormal(5.0, 2.0, 4000),
            np.concatenate([rng.normal(0, 1, 3990), np.full(10, 1e6)]),
            rng.normal(3.0, 1.0, 4000),
        ],
        axis=1,
    ).astype(np.float32)
    batch = Batch.from_tensors(
        torch.from_numpy(raw), torch.zeros(4000, 1, dtype=torch.int64), torch.zeros(4000), kind="batch"
    )
    stats = fit_dense_stats(layout, [batch.slice(0, 2500), batch.slice(2500, 4000)], max_rows=3000)
    assert stats.rows == 3000
    model = build_model(spec.model, layout=layout, stats=stats)
    out = model.dense_transform(torch.from_numpy(raw[:3000])).numpy()
    assert abs(out[:, 0].mean()) < 1e-3 and abs(out[:, 0].std() - 1) < 1e-3
    assert abs(out[:, 1].mean()) < 1e-3 and abs(out[:, 1].std() - 1) < 1e-3  # standardized after log1p
    assert out[:, 2].max() < 5  # the outliers clipped to the 99th percentile
    assert np.allclose(out[:, 3], raw[:3000, 3])  # none: as it is
    missing = model.dense_transform(torch.tensor([[math.nan] * 4]))
    assert missing[0, :3].tolist() == [0.0, 0.0, 0.0] and missing[0, 3].item() == 7.0  # mean (0) / the fill
    # the statistics are buffers: a model loaded from the state dict transforms the same
    other = build_model(spec.model, layout=layout)
    other.load_state_dict(model.state_dict())
    assert torch.equal(
        other.dense_transform(torch.from_numpy(raw[:5])), model.dense_transform(torch.from_numpy(raw[:5]))
    )


def jagged_batch(rows: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (rows,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    values = torch.randint(0, 50, (int(offsets[-1]),), generator=g)
    label = (lengths > 1).float()  # the list carries the signal
    return Batch.from_tensors(
        torch.randn(rows, 2, generator=g),
        torch.randint(0, 100, (rows, 2), generator=g),
        label,
        kind="batch",
        sparse_names=["user", "item"],
        lists={"tags": Jagged(values, offsets, torch.rand(len(values), generator=g))},
    )


@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("model_type", ["single", "mtrm"])
def test_list_features_pool_without_padding_and_train_sparse_rows(pooling: str, model_type: str) -> None:
    spec = training(
        categorical=[{"name": "user", "buckets": 200, "dim": 4}],
        categorical_list=[{"name": "tags", "pooling": pooling}],
    ).model_copy(update={"mode": "mixed"})
    spec.model = ModelSpec(type=model_type, hash_buckets=1000, embedding_dim=4)
    batch = jagged_batch(64)
    layout = ModelInit.of_batch(spec, _mapping(), batch).layout
    assert [c.name for c in layout.lists] == ["tags"] and layout.lists[0].weighted
    model = build_model(spec.model, layout=layout)
    trainer = Trainer(model, spec)
    tables = {name: p for name, p in model.named_parameters() if name.endswith("table.weight")}
    before = {name: p.detach().clone() for name, p in tables.items()}
    for kind in ("batch", "stream") if model_type == "mtrm" else ("batch",):
        loss = trainer.train_step(Batch.from_arrow(batch.columns, kind=kind))
        assert math.isfinite(loss)
    changed = {name for name, p in tables.items() if not torch.equal(p, before[name])}
    assert any(".user." in name for name in changed) and any(".shared." in name for name in changed)
    # an empty list pools to zeros; a sliced batch pools the same rows
    head = batch.slice(0, 10)
    assert torch.allclose(
        model.predict(head.dense, head.sparse, head.lists), model.predict(batch.dense, batch.sparse, batch.lists)[:10]
    )


def test_weighted_mean_pooling_is_the_weighted_average() -> None:
    spec = training(categorical_list=[{"name": "tags", "pooling": "mean"}])
    layout = FeatureLayout.resolve(spec, [], [], ["tags"], weighted=["tags"])
    model = build_model(spec.model, layout=layout)
    table = model.tower.embedding.tables["shared"]
    jagged = Jagged(torch.tensor([3, 4]), torch.tensor([0, 2, 2]), torch.tensor([1.0, 3.0]))
    pooled = table.pooled(0, jagged)
    rows = table.table(table._buckets(jagged.values.unsqueeze(1), table.salts[:, 0:1]).squeeze(1))
    assert torch.allclose(pooled[0], (rows[0] * 1 + rows[1] * 3) / 4) and torch.equal(pooled[1], torch.zeros(4))


def _mapping():  # columns of jagged_batch
    from primus_dagster.spec.sources import ColumnMapping

    return ColumnMapping(ts="t", dense=["a", "b"], sparse=["user", "item"], lists=["tags"], weights={"tags": "w"})


def test_string_lists_are_hashed_like_string_ids_and_null_lists_are_empty() -> None:
    source = SourceSpecAdapter.validate_python(
        {
            "name": "src",
            "type": "parquet",
            "path": "p",
            "columns": {"ts": "t", "ts_unit": "s", "label": "y", "sparse": ["u"], "lists": {"genres": "g"}},
        }
    )
    native = pa.record_batch(
        {
            "t": pa.array([0, 1, 2], pa.int64()),
            "y": pa.array([1.0, 0.0, 1.0]),
            "u": pa.array(["a", "b", "a"]),
            "g": pa.array([["x", "y"], None, ["y"]], pa.list_(pa.string())),
        }
    )
    out = Batch.from_arrow(Normalizer(source)(native, where="f.parquet"), kind="batch")
    jagged = out.lists["genres"]
    expected = stable_hash64(pa.array(["x", "y", "y"])).to_numpy()
    assert jagged.values.tolist() == expected.tolist() and jagged.offsets.tolist() == [0, 2, 2, 3]
    assert out.sparse[:, 0].tolist() == stable_hash64(pa.array(["a", "b", "a"])).to_pylist()
    assert out.dense.shape == (3, 0)  # zero dense columns


def test_a_list_column_declared_scalar_and_a_scalar_declared_list_are_named() -> None:
    from primus_dagster.data.canonical import SchemaMismatchError

    def source(columns: dict) -> object:
        return SourceSpecAdapter.validate_python(
            {"name": "src", "type": "parquet", "path": "p", "columns": {"ts": "t", "ts_unit": "s", **columns}}
        )

    native = pa.record_batch(
        {"t": pa.array([0], pa.int64()), "g": pa.array([["x"]], pa.list_(pa.string())), "u": pa.array(["a"])}
    )
    with pytest.raises(SchemaMismatchError, match=r"f.parquet: sparse column 'g' .* map it in columns.lists"):
        Normalizer(source({"sparse": ["g"]}))(native, where="f.parquet")
    with pytest.raises(SchemaMismatchError, match=r"f.parquet: list column 'u' has type string; expected a list"):
        Normalizer(source({"lists": ["u"]}))(native, where="f.parquet")


def test_declared_features_must_be_mapped() -> None:
    from primus_dagster.spec.job import JobSpec

    job = {
        "name": "j",
        "dataset": {
            "start": "2026-11-01",
            "streams": [
                {
                    "name": "s",
                    "sources": [{"name": "a", "type": "parquet", "path": "p", "columns": {"ts": "t", "sparse": ["u"]}}],
                }
            ],
        },
        "training": {"features": {"categorical_list": [{"name": "u"}]}},
    }
    with pytest.raises(
        ValueError,
        match=r"categorical_list: 'u' is not in columns.lists of source 'a' \(it is mapped in columns.sparse\)",
    ):
        JobSpec.model_validate(job)


def test_a_batch_of_other_columns_than_the_layout_is_named() -> None:
    layout = FeatureLayout.plain(ModelSpec(), n_dense=2, n_sparse=1)
    with pytest.raises(ValueError, match=r"every source of a job must map the same canonical columns"):
        layout.check(jagged_batch(4))


def test_tables_train_with_the_row_sparse_optimiser_only_where_touched() -> None:
    spec = training(categorical=[{"name": "user", "buckets": 300, "dim": 4}])
    batch = jagged_batch(32)
    layout = ModelInit.of_batch(spec, _mapping(), batch).layout
    model = build_model(spec.model, layout=layout)
    table = model.tower.embedding.tables["user"]
    before = table.table.weight.detach().clone()
    Trainer(model, spec).train_step(batch)
    changed = (table.table.weight.detach() != before).any(dim=1).nonzero().flatten()
    assert set(changed.tolist()) == set(table.bucket_ids(batch.sparse[:, :1]).unique().tolist())
    assert F.relu(torch.zeros(1)).item() == 0.0


def test_deterministic_order_with_several_trainers_is_a_valid_spec() -> None:
    from primus_dagster.spec.job import JobSpec

    job = {
        "name": "j",
        "pools": {"training": {"replicas": 2, "max_replicas": 2}},
        "data": {"deterministic": True},
        "dataset": {
            "start": "2026-11-01",
            "streams": [
                {
                    "name": "s",
                    "sources": [{"name": "a", "type": "parquet", "path": "p", "columns": {"ts": "t", "sparse": ["u"]}}],
                }
            ],
        },
    }
    spec = JobSpec.model_validate(job)  # each batch's trainer is fixed (tests/training/test_deterministic_runs.py)
    assert spec.data.deterministic and spec.pools.training.replicas == 2

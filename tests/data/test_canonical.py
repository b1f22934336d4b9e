"""The canonical normaliser: types, dense stacking, ms timestamps, clear mismatch errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from primus_dagster.data.canonical import Normalizer, SchemaMismatchError, canonical_schema, schema_hash
from primus_dagster.spec import parse_job_spec


def source(columns: str):
    return parse_job_spec(f"""
name: t
dataset:
  start: 2026-11-01
  streams:
    - name: s
      sources:
        - {{name: src, type: kafka, kind: stream, topic: t, columns: {columns}}}
""").dataset.source("src")


def test_dense_columns_are_stacked_and_ids_cast() -> None:
    norm = Normalizer(source("{ts: t, label: y, id: i, dense: [a, b], sparse: {user: u}}"))
    batch = pa.record_batch(
        {
            "t": pa.array([1_700_000_000_000, 1_700_000_000_500], pa.int64()),  # epoch ms
            "y": pa.array([1, None], pa.int8()),
            "i": pa.array([5, 6], pa.int32()),
            "a": pa.array([1.0, 2.0], pa.float64()),
            "b": pa.array([3, 4], pa.int16()),
            "u": pa.array([7, 8], pa.int32()),
        }
    )
    out = norm(batch)
    assert out.schema == canonical_schema(norm.mapping, 2)
    assert out.schema.names == ["sample_id", "ts", "label", "dense", "user", "source", "kind"]
    rows = out.to_pylist()
    assert rows[0]["dense"] == [1.0, 3.0] and rows[1]["dense"] == [2.0, 4.0]
    assert rows[1]["label"] is None and rows[0]["label"] == 1.0
    assert rows[1]["ts"].microsecond == 500_000
    assert rows[0]["source"] == "src" and rows[0]["kind"] == "stream"


def test_dense_list_column_passes_through() -> None:
    norm = Normalizer(source("{ts: t, dense: f}"))
    values = pa.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], pa.list_(pa.float64()))
    out = norm(pa.record_batch({"t": pa.array([0, 1], pa.timestamp("ms")), "f": values}))
    assert out.schema.field("dense").type == pa.list_(pa.float32(), 3)
    np.testing.assert_array_equal(out.column("dense").flatten().to_numpy(), np.arange(1, 7, dtype=np.float32))
    assert out.column("label").null_count == 2


def test_ragged_dense_lists_are_rejected() -> None:
    norm = Normalizer(source("{ts: t, dense: f}"))
    batch = pa.record_batch({"t": pa.array([0, 1], pa.int64()), "f": pa.array([[1.0, 2.0], [3.0]])})
    with pytest.raises(SchemaMismatchError, match="not all of length"):
        norm(batch, where="file.parquet")


def test_missing_column_names_where_and_what() -> None:
    norm = Normalizer(source("{ts: t, dense: [a]}"))
    with pytest.raises(SchemaMismatchError, match=r"f\.parquet: column 'a' is missing"):
        norm(pa.record_batch({"t": pa.array([0], pa.int64())}), where="f.parquet")


def test_non_numeric_feature_is_rejected() -> None:
    norm = Normalizer(source("{ts: t, dense: [a]}"))
    with pytest.raises(SchemaMismatchError, match="dense column 'a' has type string"):
        norm(pa.record_batch({"t": pa.array([0], pa.int64()), "a": pa.array(["x"])}))


def test_schema_hash_is_stable_and_type_sensitive() -> None:
    a = pa.schema([("x", pa.int64())])
    assert schema_hash(a) == schema_hash(pa.schema([("x", pa.int64())]))
    assert schema_hash(a) != schema_hash(pa.schema([("x", pa.int32())]))

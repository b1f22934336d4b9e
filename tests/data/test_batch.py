"""Batch: the one batch type -- typed zero-copy tensors, canonical round trip, slices, metadata."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch

from primus_dagster.data import Batch, BatchId, BatchMeta, Normalizer
from tests.data.executor.datakit import T0, job_spec, native


def canonical(n: int = 1000) -> pa.RecordBatch:
    source = job_spec().dataset.source("src")
    out = Normalizer(source)(native(T0, n, 0).to_batches()[0])
    # Nulls as a join leaves them (the normaliser's quality policy repairs or drops those of a source).
    label = pa.array([None if i % 7 == 0 else i % 2 for i in range(n)], pa.float32())
    out = out.set_column(out.schema.get_field_index("label"), out.schema.field("label"), label)
    user = pa.array([None if i % 5 == 0 else i for i in range(n)], pa.int64())
    return out.set_column(out.schema.get_field_index("user_id"), out.schema.field("user_id"), user)


def test_tensors_are_typed_views() -> None:
    data = canonical(1000)
    batch = Batch.from_arrow(data, stream="history", batch_id=BatchId("t", 0, 1000))
    assert batch.kind == "batch" and batch.source == "src" and batch.rows == 1000
    assert batch.dense.dtype == torch.float32 and tuple(batch.dense.shape) == (1000, 2)
    values = data.column("dense").values
    assert batch.dense.data_ptr() == values.buffers()[1].address  # zero-copy
    np.testing.assert_array_equal(batch.dense[:, 1].numpy(), data.column("dense").flatten().to_numpy()[1::2])
    assert batch.label.dtype == torch.float32 and torch.isnan(batch.label[0]) and batch.label[1] == 1.0
    assert int(torch.isnan(batch.label).sum()) == data.column("label").null_count
    assert batch.ts.dtype == torch.int64 and int(batch.ts[0]) == data.column("ts")[0].value
    assert batch.sparse_names == ["user_id"] and batch.sparse.dtype == torch.int64
    assert tuple(batch.sparse.shape) == (1000, 1)
    assert int(batch.sparse[0, 0]) == 0 and int(batch.sparse[1, 0]) == 1  # null id -> 0
    assert batch.sample_id is not None and batch.sample_id.tolist() == list(range(1000))


def test_slices_share_memory_and_keep_identity() -> None:
    batch = Batch.from_arrow(canonical(64), batch_id=BatchId("t", 100, 64))
    part = batch.slice(10, 30)
    assert part.rows == 20 and part.batch_id == BatchId("t", 110, 20)
    assert part.sample_id is not None and part.sample_id.tolist() == list(range(10, 30))
    converted = Batch.from_arrow(canonical(64)).slice(0, 64)
    dense = converted.dense
    assert converted.slice(5, 9).dense.data_ptr() == dense[5:9].data_ptr()  # sliced, not reconverted
    assert batch.slice(60, 1000).rows == 4


def test_no_per_row_work_on_a_million_rows() -> None:
    big = pa.Table.from_batches([canonical(1000)] * 1000).combine_chunks().to_batches()[0]
    batch = Batch.from_arrow(big)
    assert tuple(batch.dense.shape) == (1_000_000, 2)
    assert batch.dense.data_ptr() == big.column("dense").values.buffers()[1].address  # a view, not a copy


def test_canonical_round_trip_and_metadata() -> None:
    data = canonical(50)
    batch = Batch.from_arrow(data, stream="history", batch_id=BatchId("t", 0, 50))
    assert "source" not in batch.columns.schema.names and "kind" not in batch.columns.schema.names
    again = batch.canonical()
    assert again.equals(data.cast(again.schema)) and again.schema.names == data.schema.names
    assert BatchMeta.decode(batch.meta.encode()) == batch.meta
    with pytest.raises(ValueError, match="metadata says 50 rows"):
        Batch(data.slice(1), batch.meta)
    with pytest.raises(ValueError, match="bad batch metadata"):
        BatchMeta.decode(b'{"task_id": "t"}')


def test_concat_pickle_and_kind() -> None:
    parts = [Batch.from_arrow(canonical(30)), Batch.from_arrow(canonical(20))]
    joined = Batch.concat(parts)
    assert joined.rows == 50 and joined.kind == "batch"
    back = pickle.loads(pickle.dumps(joined))
    assert back.meta == joined.meta and torch.equal(back.sparse, joined.sparse)
    stream = Batch.from_arrow(canonical(5), kind="stream")
    assert stream.kind == "stream"
    with pytest.raises(ValueError, match="kind not given"):
        Batch.from_arrow(canonical(5).select([0, 1, 2, 3]).slice(0, 0))


def test_a_pickled_slice_carries_only_its_rows() -> None:
    big = Batch.from_arrow(pa.Table.from_batches([canonical(1000)] * 100).combine_chunks().to_batches()[0])
    part = big.slice(500, 600)
    back = pickle.loads(pickle.dumps(part))
    assert len(pickle.dumps(part)) < len(pickle.dumps(big)) / 50
    assert back.meta == part.meta and back.columns.equals(part.columns)

"""Batch: the one batch type -- typed zero-copy tensors, canonical round trip, slices, metadata."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch

from primus_dagster.data import Batch, BatchId, BatchMeta, Normalizer
from primus_dagster.data.canonical import dense_parts, join_dense, split_dense
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


def served(data: pa.RecordBatch) -> pa.RecordBatch:
    """``data`` in the serving layout, through an IPC stream (as a slot or a Flight message holds it)."""
    sink = pa.BufferOutputStream()
    wire = split_dense(data)
    with pa.ipc.new_stream(sink, wire.schema) as writer:
        writer.write_batch(wire)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch()


def test_the_serving_layout_is_the_same_batch() -> None:
    data = canonical(1000)
    wire = served(data)
    assert wire.schema.names[2:5] == ["label", "dense.0", "dense.1"] and dense_parts(wire.schema) == [3, 4]
    batch = Batch(wire, BatchMeta("t", 0, 1000, "history", "batch", "src"))
    assert batch.schema.equals(data.schema) and batch.sparse_names == ["user_id"]
    # dense: a column-major view over the two columns (no interleaving), the same values
    distance = wire.column(4).buffers()[1].address - wire.column(3).buffers()[1].address
    assert batch.dense.stride() == (1, distance // 4)
    assert batch.dense.data_ptr() == wire.column(3).buffers()[1].address
    np.testing.assert_array_equal(batch.dense.numpy(), Batch.from_arrow(data).dense.numpy())
    assert batch.columns.equals(data)  # canonical on demand
    head = batch.slice(10, 20)
    assert head.columns.equals(data.slice(10, 10)) and torch.equal(head.dense, batch.dense[10:20])
    assert Batch.concat([head, batch.slice(20, 25)]).columns.equals(data.slice(10, 15))
    again = pickle.loads(pickle.dumps(batch.slice(0, 3)))
    assert again.columns.equals(data.slice(0, 3)) and torch.equal(again.dense, batch.dense[:3])


def test_split_dense_round_trip_keeps_nulls_as_nan() -> None:
    data = canonical(50)
    dense = data.column("dense")
    masked = pa.FixedSizeListArray.from_arrays(dense.values, 2, mask=pa.array([i == 3 for i in range(50)]))
    data = data.set_column(data.schema.get_field_index("dense"), data.schema.field("dense"), masked)
    back = join_dense(split_dense(data))
    assert back.schema.equals(data.schema)
    got = back.column("dense").flatten().to_numpy(zero_copy_only=False).reshape(50, 2)
    assert np.isnan(got[3]).all() and np.array_equal(got[4], dense[4].values.to_numpy())
    assert join_dense(data) is data and split_dense(split_dense(data)).schema.equals(split_dense(data).schema)


def test_the_normaliser_serves_split_dense_columns_as_decoded() -> None:
    source = job_spec().dataset.source("src")
    raw = native(T0, 200, 0).to_batches()[0]
    canonical_out = Normalizer(source)(raw)
    split = Normalizer(source, split_dense=True)(raw)
    assert join_dense(split).equals(canonical_out)
    assert split.column("dense.0").buffers()[1].address == raw.column("d0").buffers()[1].address  # not copied
    broken = raw.set_column(raw.schema.get_field_index("d1"), "d1", pa.array([np.nan] * 200, pa.float32()))
    norm = Normalizer(source, split_dense=True)
    got, want = join_dense(norm(broken)), Normalizer(source)(broken)
    assert got.schema.equals(want.schema) and norm.take() == {"dense_invalid": 200}
    np.testing.assert_array_equal(got.column("dense").flatten(), want.column("dense").flatten())  # NaN == NaN here

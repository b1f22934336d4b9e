"""RemoteReader: tensors without per-row work, kind queues, claims dropping duplicates, barriers."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from primus_dagster.data.canonical import Normalizer
from primus_dagster.data.executor import DataExecutor
from primus_dagster.data.executor.wire import BatchMeta
from primus_dagster.data.reader import QueueStat, RemoteReader, RoundRobin, batch_first, to_train_batch
from tests.data.executor.datakit import T0, FakeDriver, job_spec, native, plan, write_tree


def canonical(n: int = 1000) -> pa.RecordBatch:
    source = job_spec().dataset.source("src")
    table = native(T0, n, 0)
    table = table.set_column(2, "click", pa.array([None if i % 7 == 0 else i % 2 for i in range(n)], pa.int32()))
    table = table.set_column(5, "user_id", pa.array([None if i % 5 == 0 else i for i in range(n)], pa.int64()))
    return Normalizer(source)(table.to_batches()[0])


def meta(batch: pa.RecordBatch, kind: str = "batch") -> BatchMeta:
    return BatchMeta("t", 0, batch.num_rows, "history", kind, "src")


def test_train_batch_arrays_are_typed_views() -> None:
    batch = canonical(1000)
    tb = to_train_batch(batch, meta(batch), framework="numpy")
    assert tb.dense.dtype == np.float32 and tb.dense.shape == (1000, 2)
    values = batch.column("dense").values
    assert tb.dense.__array_interface__["data"][0] == values.buffers()[1].address  # zero-copy
    np.testing.assert_array_equal(tb.dense[:, 1], batch.column("dense").flatten().to_numpy()[1::2])
    assert tb.label.dtype == np.float32 and np.isnan(tb.label[0]) and tb.label[1] == 1.0
    assert np.isnan(tb.label).sum() == batch.column("label").null_count
    assert tb.ts.dtype == np.int64 and tb.ts[0] == batch.column("ts")[0].value
    assert list(tb.sparse) == ["user_id"] and tb.sparse["user_id"].dtype == np.int64
    assert tb.sparse["user_id"][0] == 0 and tb.sparse["user_id"][1] == 1  # null id -> 0
    assert tb.sample_id.tolist() == list(range(1000))
    assert tb.sparse_matrix().shape == (1000, 1) and tb.rows == 1000


def test_train_batch_torch_and_sliced_input() -> None:
    batch = canonical(64).slice(10, 20)
    tb = to_train_batch(batch, meta(batch))
    assert tb.dense.dtype == torch.float32 and tuple(tb.dense.shape) == (20, 2)
    assert tb.sparse["user_id"].dtype == torch.int64 and tb.label.dtype == torch.float32
    assert tb.ts.dtype == torch.int64 and tuple(tb.sparse_matrix().shape) == (20, 1)
    assert tb.sample_id.tolist() == list(range(10, 30))
    with pytest.raises(ValueError, match="framework"):
        to_train_batch(batch, meta(batch), framework="jax")


def test_conversion_has_no_per_row_work() -> None:
    big = pa.Table.from_batches([canonical(1000)] * 1000).combine_chunks().to_batches()[0]  # 1M rows
    start = time.perf_counter()
    tb = to_train_batch(big, meta(big), framework="numpy")
    assert tb.dense.shape == (1_000_000, 2)
    assert time.perf_counter() - start < 0.5


def test_choosers() -> None:
    def stats(b: int, s: int) -> dict[str, QueueStat]:
        return {"batch": QueueStat("batch", b, 4, 0, 0.0), "stream": QueueStat("stream", s, 4, 0, 0.0)}

    assert batch_first(stats(1, 1)) == "batch" and batch_first(stats(0, 2)) == "stream"
    rr = RoundRobin()
    assert [rr(stats(1, 1)), rr(stats(1, 1)), rr(stats(1, 0)), rr(stats(0, 3))] == [
        "batch",
        "stream",
        "batch",
        "stream",
    ]


def test_reader_routes_kinds_and_reports_consumed_batches(tmp_path: Path) -> None:
    ids = write_tree(tmp_path, rel="pq", hours=1, files=2, rows=100)
    live = write_tree(tmp_path, rel="live", hours=1, files=1, rows=100, first_id=10_000)
    job = job_spec(batch_rows=25, stream_source=True)
    driver = FakeDriver(plan(job, tmp_path, hours=1))
    with DataExecutor(driver, job, "data-0", str(tmp_path), heartbeat_s=0.05) as executor:
        reader = RemoteReader(driver, 0, None, prefetch=16, framework="numpy")  # discovered via the driver
        first = reader.next_batch(kind="stream", timeout=10)
        assert first is not None and first.kind == "stream" and first.stream == "fresh" and first.source == "live"
        batches = [first, *reader]
        reader.close()
        assert executor.finished()
    got_batch = [i for b in batches if b.kind == "batch" for i in b.sample_id.tolist()]
    got_stream = [i for b in batches if b.kind == "stream" for i in b.sample_id.tolist()]
    assert sorted(got_batch) == ids and sorted(got_stream) == live
    assert len(reader.consumed()) == len(batches) == 12
    snapshot = reader.barrier(1)
    assert snapshot == {"barrier_id": 1, "consumed": 12} and reader.consumed() == []
    assert len(driver.consumed["trainer-0"]) == 12
    assert reader.next_batch() is None


def test_duplicates_from_two_executors_are_dropped(tmp_path: Path) -> None:
    ids = write_tree(tmp_path, hours=2, files=1, rows=90)
    job = job_spec(batch_rows=30)
    tasks = plan(job, tmp_path)
    ledger = FakeDriver(tasks)  # the reader's driver: the claim ledger
    other = FakeDriver(tasks)  # a second executor handed the same tasks (as after a lost lease)
    with (
        DataExecutor(ledger, job, "data-0", str(tmp_path), heartbeat_s=0.05) as a,
        DataExecutor(other, job, "data-1", str(tmp_path), heartbeat_s=0.05) as b,
    ):
        with RemoteReader(ledger, 0, [a.location, b.location], prefetch=2) as reader:
            got = [i for batch in reader for i in batch.sample_id.tolist()]
    assert sorted(got) == ids
    assert reader.stats["dropped"] == reader.stats["received"] - reader.stats["yielded"] == 6
    assert sum(first for _, _, first in ledger.claims) == 6


def test_next_batch_times_out_and_rejects_unknown_kinds(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=5)
    driver = FakeDriver(plan(job_spec(), tmp_path, hours=1))  # a pending task nobody runs: never done
    reader = RemoteReader(driver, 0, lambda: [], framework="numpy", refresh_s=0.05)
    with pytest.raises(ValueError, match="no queue"):
        reader.next_batch(kind="other")
    with pytest.raises(TimeoutError):
        reader.next_batch(timeout=0.2)
    reader.close()
    assert reader.next_batch() is None  # closed

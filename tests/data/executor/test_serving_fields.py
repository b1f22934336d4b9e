"""The serving fast path: fields the trainers read (projection), zero-copy sparse views, no ts."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from primus_dagster.data import Batch, Normalizer, SourceContext, arrow_to_tensors, make_adapter
from primus_dagster.data.canonical import check_fields, native_columns
from primus_dagster.data.executor import DataExecutor
from primus_dagster.data.executor.process import ExecutorConfig, parse_args
from primus_dagster.spec import parse_job_spec
from tests.data.executor.datakit import FakeDriver, job_spec, job_text, plan, write_tree
from tests.data.executor.test_executor import join_task
from tests.data.planekit import local_plane

TRAIN = ("label", "dense", "sparse")


def drain(executor: DataExecutor) -> list[Batch]:
    out: list[Batch] = []

    def run() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            item = executor.take(0, timeout=0.5)
            if item is not None:
                out.append(item)
            elif executor.finished():
                return

    with executor:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(30)
    return out


def test_check_fields_names_what_is_wrong() -> None:
    assert check_fields(None) is None
    assert check_fields(TRAIN) == frozenset(TRAIN)
    with pytest.raises(ValueError, match="unknown canonical fields"):
        check_fields(["label", "dense", "sparse", "tss"])
    with pytest.raises(ValueError, match="must include"):
        check_fields(["dense", "sparse"])


def test_normalizer_leaves_out_fields_and_constants(tmp_path: Path) -> None:
    job = job_spec()
    spec = job.dataset.source("src")
    assert native_columns(spec.columns, frozenset(TRAIN)) == ["click", "d0", "d1", "user_id"]
    write_tree(tmp_path, hours=1, files=1, rows=10)
    native = pq.read_table(next((tmp_path / "pq").rglob("*.parquet"))).to_batches()[0]
    full = Normalizer(spec)(native)
    slim = Normalizer(spec, fields=TRAIN, constants=False)(native)
    assert slim.schema.names == ["label", "dense", "user_id"]
    for name in slim.schema.names:
        assert slim.column(name).equals(full.column(name))


def test_projected_parquet_adapter_decodes_only_the_fields(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=50)
    job = job_spec(batch_rows=20)
    adapter = make_adapter(job.dataset.source("src"), SourceContext(str(tmp_path))).project(TRAIN, constants=False)
    assert adapter.columns == ["click", "d0", "d1", "user_id"]  # type: ignore[attr-defined]
    (task,) = plan(job, tmp_path, hours=1)
    batches = list(adapter.read(task.read))
    assert [b.num_rows for b in batches] == [20, 20, 10]
    assert all(b.schema.names == ["label", "dense", "user_id"] for b in batches)


def test_executor_serves_only_the_fields_every_row_once(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=2, files=2, rows=120)
    job = job_spec(batch_rows=50)
    tasks = plan(job, tmp_path)
    driver = FakeDriver(tasks)
    items = drain(DataExecutor(driver, job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05, fields=TRAIN))
    assert sum(b.rows for b in items) == 480
    assert sorted((b.meta.task_id, b.meta.first_row) for b in items) == sorted(
        (t.task_id, first) for t in tasks for first in (0, 50, 100)
    )
    assert all(b.columns.schema.names == ["label", "dense", "user_id"] for b in items)
    assert items[0].ts is None and items[0].sample_id is None and items[0].sparse.shape == (50, 1)
    assert all(r.state == "succeeded" for r in driver.tasks.values())


def test_join_tasks_still_join_on_fields_the_trainers_do_not_read(tmp_path: Path) -> None:
    task, job, _ = join_task(tmp_path)
    items = drain(DataExecutor(FakeDriver([task]), job, "data-0", str(tmp_path), serve=False, fields=TRAIN))
    assert [b.rows for b in items] == [40, 40, 20]
    assert items[0].columns.schema.names == ["label", "dense", "user_id"]
    labels = torch.cat([b.label for b in items])
    assert labels.tolist() == [1.0 if i % 4 == 0 else 0.0 for i in range(100)]


def test_fields_travel_on_the_executor_command_line() -> None:
    config = ExecutorConfig(driver="grpc://127.0.0.1:1", executor_id="data-0", job_spec="j.yaml", fields=TRAIN)
    parsed, _ = parse_args(config.argv())
    assert parsed.fields == TRAIN
    assert parse_args(ExecutorConfig("grpc://x:1", "data-0", "j.yaml").argv())[0].fields is None


def ipc_round_trip(batch: pa.RecordBatch) -> pa.RecordBatch:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch()


def canonical_columns(n: int, nulls: bool = False) -> pa.RecordBatch:
    rng = np.random.default_rng(0)
    a = pa.array(rng.integers(-(2**40), 2**40, n))
    b = pa.array([None if nulls and i == 3 else int(i) for i in range(n)], pa.int64())
    return pa.record_batch(
        {
            "label": pa.array(rng.random(n, dtype=np.float32)),
            "dense": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(2 * n, dtype=np.float32)), 2),
            "a": a,
            "b": b,
            "c": pa.array(rng.integers(0, 7, n)),
        }
    )


def test_sparse_of_an_ipc_batch_is_a_zero_copy_view() -> None:
    data = ipc_round_trip(canonical_columns(1000))
    tensors = arrow_to_tensors(data)
    expected = np.stack([data.column(name).to_numpy() for name in ("a", "b", "c")], axis=1)
    assert np.array_equal(tensors.sparse.numpy(), expected) and tensors.ts is None
    assert not tensors.sparse.is_contiguous()  # column-major: [B, F] with strides (1, distance)
    assert tensors.sparse.data_ptr() == data.column("a").buffers()[1].address
    head = arrow_to_tensors(data.slice(10, 5)).sparse
    assert np.array_equal(head.numpy(), expected[10:15])
    batch = Batch(data, Batch.from_arrow(data, kind="batch").meta)
    assert batch.slice(990, 1000).sparse.tolist() == expected[990:].tolist()


def test_sparse_falls_back_to_a_copy_when_no_view_fits() -> None:
    with_nulls = arrow_to_tensors(ipc_round_trip(canonical_columns(20, nulls=True)))
    assert with_nulls.sparse[3, 1] == 0 and with_nulls.sparse.is_contiguous()  # null -> 0
    separate = canonical_columns(20)  # columns in separate allocations
    tensors = arrow_to_tensors(separate)
    assert tensors.sparse.is_contiguous()
    assert np.array_equal(tensors.sparse[:, 0].numpy(), separate.column("a").to_numpy())


@pytest.mark.parametrize("shm", [True, False])
def test_plane_with_fields_delivers_every_row_once(tmp_path: Path, shm: bool) -> None:
    ids = write_tree(tmp_path, hours=2, files=2, rows=300)
    job_path = tmp_path / "job.yaml"
    job_path.write_text(job_text(batch_rows=128))
    tasks = plan(parse_job_spec(job_path.read_text()), tmp_path)
    rows, sparse = 0, []
    plane = local_plane(job_path, tmp_path, tasks, executors=2, shm=shm, fields=TRAIN)  # executor processes
    with plane, plane.reader(0) as reader:
        for batch in reader:
            assert batch.ts is None and batch.columns.schema.names == ["label", "dense", "user_id"]
            rows += batch.rows
            sparse.append(batch.sparse.clone())
    assert rows == len(ids) == 1200
    assert plane.driver.status()["done"]
    native = pa.concat_tables(pq.read_table(p) for p in sorted((tmp_path / "pq").rglob("*.parquet")))
    assert sorted(torch.cat(sparse)[:, 0].tolist()) == sorted(native["user_id"].to_pylist())

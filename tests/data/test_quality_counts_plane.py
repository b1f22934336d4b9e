"""Data-quality counts through the real data plane: executor -> Flight driver client -> driver, summed there;
a `fail` policy or a type error fails the task at once (never retried), naming file and column."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from primus_dagster.data import Batch, DataDriver, DriverClient, DriverServer
from primus_dagster.data.executor import DataExecutor
from primus_dagster.spec import parse_job_spec
from tests.data.executor.datakit import T0, job_text, native, plan, write_tree


def spoil(path: Path) -> None:
    """Rewrite one Parquet file: dense NaN in row 0, +inf in row 1, null labels in rows 2-3, row 4 an hour late."""
    table = pq.read_table(path)
    n = table.num_rows
    d0 = table.column("d0").to_numpy().copy()
    d0[0], d0[1] = np.nan, np.inf
    click = pa.array([None if i in (2, 3) else v for i, v in enumerate(table.column("click").to_pylist())], pa.int32())
    ts = table.column("event_time").to_pylist()
    ts[4] = ts[4] + timedelta(hours=1)
    table = table.set_column(table.schema.get_field_index("d0"), "d0", pa.array(d0, pa.float32()))
    table = table.set_column(table.schema.get_field_index("click"), "click", click)
    table = table.set_column(
        table.schema.get_field_index("event_time"), "event_time", pa.array(ts, table.schema.field("event_time").type)
    )
    assert table.num_rows == n
    pq.write_table(table, path)


def job(quality: str = ""):
    text = job_text(batch_rows=100)
    if quality:
        text = text.replace(
            "          batch_rows: 100\n", f"          batch_rows: 100\n          quality: {quality}\n", 1
        )
    return parse_job_spec(text)


def serve_all(driver: DataDriver, spec, root: Path) -> list[Batch]:
    """Run one executor against ``driver`` over Flight until the driver is done or failed; its batches,
    each claimed as a reader claims it (the driver is done once every batch was claimed)."""
    out: list[Batch] = []
    with DriverServer(driver) as server, DriverClient(server.location) as client:
        server.serve_in_thread()
        executor = DataExecutor(client, spec, "data-0", str(root), serve=False, heartbeat_s=0.05)
        with executor:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not executor.finished():
                if (item := executor.take(0, timeout=0.2)) is not None and client.claim("trainer-0", item.batch_id):
                    out.append(item)
            assert executor.finished(), "the executor did not finish in 30 s"
    return out


def test_counts_per_rule_and_file_arrive_at_the_driver(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=2, rows=50)
    bad = sorted((tmp_path / "pq").rglob("part-00001.parquet"))[0]
    spoil(bad)
    spec = job()
    tasks = plan(spec, tmp_path, hours=1)
    driver = DataDriver(lease_s=5)
    driver.add_tasks(tasks)
    batches = serve_all(driver, spec, tmp_path)
    ids = sorted(i for b in batches for i in b.columns.column("sample_id").to_pylist())
    assert ids == [i for i in range(100) if i not in (52, 53)]  # the null labels of a batch source: dropped
    dense = np.concatenate([b.columns.column("dense").flatten().to_numpy() for b in batches])
    assert not np.isinf(dense).any() and np.isnan(dense).sum() == 2  # NaN / inf: repaired to missing (NaN)
    counts = driver.quality_counts()
    expected = {"dense_invalid": 2, "null_label": 2, "ts_outside_partition": 1}
    assert counts["total"] == expected and counts["by_source"] == {"src": expected}
    ((task_id, per_task),) = counts["by_task"].items()
    assert task_id.endswith(str(bad)) and per_task == expected
    assert counts["by_location"] == {"src": {rule: {str(bad): n} for rule, n in expected.items()}}  # the file named
    columns = {"dense_invalid": ["d0"], "null_label": ["click"], "ts_outside_partition": ["event_time"]}
    assert counts["columns"] == {"src": columns}  # and the native columns whose values broke each rule
    assert driver.status()["quality"] == expected and driver.status()["done"]
    consumed = [b.batch_id for b in batches]
    assert not any(driver.claim_many("trainer-0", consumed))  # claimed as they were served
    snapshot = driver.barrier("trainer-0", consumed, 1)
    assert snapshot is not None
    assert DataDriver.restore(snapshot).quality_counts() == counts  # a checkpoint keeps them


def test_fail_policy_fails_the_task_at_once_naming_file_and_column(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=2, rows=50)
    bad = sorted((tmp_path / "pq").rglob("part-00001.parquet"))[0]
    spoil(bad)
    spec = job("{dense_invalid: fail}")
    driver = DataDriver(lease_s=5, max_attempts=3, failed_task_threshold=0.5)
    driver.add_tasks(plan(spec, tmp_path, hours=1))
    serve_all(driver, spec, tmp_path)
    (row,) = driver.failure_report()
    assert row["attempts"] == 1 and row["failures"] == 1  # not retried
    assert str(bad) in row["error"] and "column 'd0'" in row["error"] and "dense_invalid" in row["error"]


def test_a_type_error_is_not_retried(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=20)
    (path,) = (tmp_path / "pq").rglob("*.parquet")
    table = native(T0, 20, 0)
    as_lists = pa.array([[v] for v in table.column("user_id").to_pylist()], pa.list_(pa.int64()))  # no id type
    pq.write_table(table.set_column(5, "user_id", as_lists), path)
    spec = job()
    driver = DataDriver(lease_s=5, max_attempts=3, failed_task_threshold=1.0)
    driver.add_tasks(plan(spec, tmp_path, hours=1))
    serve_all(driver, spec, tmp_path)
    (row,) = driver.failure_report()
    assert row["attempts"] == 1 and "SchemaMismatchError" in row["error"] and "'user_id'" in row["error"]


def test_old_callers_complete_and_fail_without_the_new_arguments(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=2, rows=10)
    driver = DataDriver(lease_s=5, max_attempts=2, failed_task_threshold=1.0)
    driver.add_tasks(plan(job(), tmp_path, hours=1))
    with DriverServer(driver) as server, DriverClient(server.location) as client:
        first, second = client.lease("e", 2)
        client.complete("e", first.task.task_id, 10, 1)
        client.fail("e", second.task.task_id, "flaky disk")  # retryable: pending again
        assert client.status()["counts"]["pending"] == 1 and client.status()["quality"] == {}


def test_concurrent_completions_sum(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=4, rows=5)
    driver = DataDriver(lease_s=5)
    driver.add_tasks(plan(job(), tmp_path, hours=1))
    leases = driver.lease("e", 4)
    threads = [
        threading.Thread(target=driver.complete, args=("e", lease.task.task_id, 5, 1, {"bad_id": 1, "null_ts": 2}))
        for lease in leases
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert driver.quality_counts()["total"] == {"bad_id": 4, "null_ts": 8}

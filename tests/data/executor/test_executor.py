"""DataExecutor in process (no Flight): exactly-once ids, claimed rows, failures, cancel, backpressure."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from primus_dagster.data import Batch
from primus_dagster.data.executor import DataExecutor, data_executor
from primus_dagster.data.tasks import DataTask, JoinInfo
from primus_dagster.spec import parse_job_spec
from tests.data.executor.datakit import FakeDriver, job_spec, plan, wait_until, write_tree


def drain(executor: DataExecutor, trainer: int = 0, timeout: float = 20) -> list[Batch]:
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item = executor.take(trainer, timeout=0.5)
        if item is None:
            if executor.finished():
                return out
            continue
        out.append(item)
    raise AssertionError(f"executor did not finish in {timeout}s (got {len(out)} batches)")


def run_all(executor: DataExecutor, trainers: int = 1) -> list[list[Batch]]:
    results: list[list[Batch]] = [[] for _ in range(trainers)]
    threads = [threading.Thread(target=lambda i=i: results[i].extend(drain(executor, i))) for i in range(trainers)]
    with executor:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    return results


def sample_ids(items: list[Batch]) -> list[int]:
    return [i for item in items for i in item.columns.column("sample_id").to_pylist()]


def test_every_row_once_with_deterministic_batch_ids(tmp_path: Path) -> None:
    ids = write_tree(tmp_path, hours=2, files=2, rows=250)
    job = job_spec(batch_rows=100, buffer_batches=3)
    tasks = plan(job, tmp_path)
    assert len(tasks) == 4
    driver = FakeDriver(tasks)
    executor = DataExecutor(driver, job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05)
    (items,) = run_all(executor)
    assert sorted(sample_ids(items)) == sorted(ids)
    by_task: dict[str, list[tuple[int, int]]] = {}
    for item in items:
        by_task.setdefault(item.meta.task_id, []).append((item.meta.first_row, item.meta.rows))
        assert item.meta.rows == item.columns.num_rows and item.meta.kind == "batch" and item.meta.stream == "history"
        assert "source" not in item.columns.schema.names  # rides in the metadata
    for task_id, spans in by_task.items():
        assert sorted(spans) == [(0, 100), (100, 100), (200, 50)], task_id
    assert all(r.state == "succeeded" and r.rows == 250 and r.batches == 3 for r in driver.tasks.values())
    # Re-running a task yields the same ids.
    again = FakeDriver(tasks[:1])
    (items2,) = run_all(DataExecutor(again, job, "data-1", str(tmp_path), serve=False, heartbeat_s=0.05))
    assert [(i.meta.task_id, i.meta.first_row, i.meta.rows) for i in items2] == [
        (tasks[0].task_id, f, n) for f, n in by_task[tasks[0].task_id]
    ]
    # A heartbeat carried the metrics.
    metrics = driver.heartbeats[-1].metrics
    assert set(metrics) >= {"rows_per_s", "batches_per_s", "buffer_fill", "cpu", "rss_bytes", "tasks_running"}
    assert 0 <= metrics["buffer_fill"] <= 1 and metrics["rss_bytes"] > 0


def test_claimed_rows_are_skipped_on_re_lease(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=250)
    job = job_spec(batch_rows=100, buffer_batches=1)
    (task,) = plan(job, tmp_path, hours=1)
    driver = FakeDriver([task])
    first = DataExecutor(driver, job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05).start()
    item = first.take(0, timeout=10)
    assert item is not None and driver.claim("trainer-0", item.meta.batch_id)  # the reader got batch 0
    first.close()  # the executor dies before finishing the task ...
    assert driver.tasks[task.task_id].state == "running"
    driver.requeue(task.task_id)  # ... its lease expires
    (items,) = run_all(DataExecutor(driver, job, "data-1", str(tmp_path), serve=False, heartbeat_s=0.05))
    assert [(i.meta.first_row, i.meta.rows) for i in items] == [(100, 100), (200, 50)]
    assert sorted(sample_ids([item, *items])) == list(range(250))
    rec = driver.tasks[task.task_id]
    assert driver.leases[-1] == ("data-1", task.task_id) and rec.attempts == 2
    assert rec.state == "succeeded" and (rec.rows, rec.batches) == (250, 3)  # the whole output


def test_read_failure_fails_the_task_with_its_file(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=2, rows=50)
    bad = sorted((tmp_path / "pq").rglob("part-00001.parquet"))[0]
    bad.write_bytes(b"not parquet at all")
    job = job_spec(batch_rows=100)
    tasks = plan(job, tmp_path, hours=1)
    driver = FakeDriver(tasks, max_attempts=2)
    (items,) = run_all(DataExecutor(driver, job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05))
    assert sorted(sample_ids(items)) == list(range(50))
    rec = next(r for r in driver.tasks.values() if r.task.read.uri.endswith("part-00001.parquet"))
    assert rec.state == "failed" and len(rec.errors) == 2
    assert str(bad) in rec.errors[0] and "SourceReadError" in rec.errors[0]


JOIN_JOB = """
name: join-test
data: {buffer_batches: 4}
dataset:
  start: 2026-11-01
  streams:
    - name: ctr
      window: 1h
      join: {left: imps, right: clicks, key: KEY, lateness: 15m}
      sources:
        - {name: imps, type: parquet, path: pq, batch_rows: 40,
           columns: {ts: event_time, id: sample_id, dense: [d0, d1], sparse: [user_id]}}
        - {name: clicks, type: parquet, path: clk,
           columns: {ts: event_time, id: sample_id, dense: [d0], sparse: [user_id]}}
"""


def join_task(tmp_path: Path, key: str = "sample_id") -> tuple[DataTask, object, pa.Table]:
    ids = write_tree(tmp_path, hours=1, files=1, rows=100)
    imps = pq.read_table(sorted((tmp_path / "pq").rglob("*.parquet"))[0])
    clicked = imps.filter(pc.equal(pc.bit_wise_and(imps["sample_id"], 1), 0))  # even ids clicked ...
    late = pc.equal(pc.bit_wise_and(clicked["sample_id"], 3), 2)  # ... ids = 2 mod 4 after the lateness
    shift = pa.array(np.where(late.to_numpy(zero_copy_only=False), 3600, 60) * 1_000_000, pa.int64())
    ts = pc.add(clicked["event_time"].cast(pa.int64()), shift).cast(pa.timestamp("us", tz="UTC"))
    clicks = clicked.set_column(1, "event_time", ts)
    for hour in (0, 1):
        directory = tmp_path / "clk" / "dt=2026-11-01" / f"hour={hour:02d}"
        directory.mkdir(parents=True)
        pq.write_table(clicks.filter(pc.equal(pc.hour(clicks["event_time"]), hour)), directory / "c.parquet")
        (directory / "_SUCCESS").touch()
    job = parse_job_spec(JOIN_JOB.replace("KEY", key))
    (left,) = [t for t in plan(job, tmp_path, hours=1) if t.read.source == "imps"]
    right = tuple(t.read for t in plan(job, tmp_path, hours=2) if t.read.source == "clicks")
    assert len(right) == 2 and len(ids) == 100
    task = DataTask(
        left.task_id, "ctr", "batch", left.partition, left.read, right, JoinInfo("imps", "clicks", key, 900.0)
    )
    return task, job, imps


def test_join_task_labels_left_rows_by_late_right_events(tmp_path: Path) -> None:
    task, job, _imps = join_task(tmp_path)
    driver = FakeDriver([task])
    (items,) = run_all(DataExecutor(driver, job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05))
    assert [(i.meta.first_row, i.meta.rows) for i in items] == [(0, 40), (40, 40), (80, 20)]
    got = pa.Table.from_batches([i.columns for i in items])
    labels = dict(zip(got["sample_id"].to_pylist(), got["label"].to_pylist(), strict=True))
    assert labels == {i: 1.0 if i % 4 == 0 else 0.0 for i in range(100)}
    assert driver.tasks[task.task_id].state == "succeeded"


def test_join_on_a_non_canonical_key_fails_clearly(tmp_path: Path) -> None:
    task, job, _ = join_task(tmp_path, key="impression_key")
    driver = FakeDriver([task], max_attempts=1)
    run_all(DataExecutor(driver, job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05))
    (error,) = driver.tasks[task.task_id].errors
    assert "KeyError" in error and "impression_key" in error and "canonical" in error


def test_backpressure_bounds_every_trainer_buffer(tmp_path: Path) -> None:
    ids = write_tree(tmp_path, hours=2, files=2, rows=200)
    job = job_spec(batch_rows=20, buffer_batches=2, trainers=2, task_runners=3)
    driver = FakeDriver(plan(job, tmp_path))
    executor = DataExecutor(driver, job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05)
    got: list[Batch] = []
    with executor:
        assert wait_until(lambda: executor.buffers.fills() == [2, 2])  # runners fill the buffers ...
        time.sleep(0.2)  # ... and then block
        assert executor.buffers.fills() == [2, 2]
        assert sum(r.state == "running" for r in driver.tasks.values()) <= 3
        while not executor.finished():
            for trainer in (0, 1):
                item = executor.take(trainer, timeout=0.01)
                if item is not None:
                    got.append(item)
                    time.sleep(0.001)
    assert executor.buffers.high_water == 2
    assert sorted(sample_ids(got)) == sorted(ids)
    assert max(r.metrics["buffer_fill"] for r in driver.heartbeats) <= 1.0


def test_cancelled_task_is_dropped_and_not_completed(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=200)
    job = job_spec(batch_rows=10, buffer_batches=2)
    (task,) = plan(job, tmp_path, hours=1)
    driver = FakeDriver([task])
    executor = DataExecutor(driver, job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05)
    with executor:
        assert wait_until(lambda: executor.buffers.fills() == [2])
        driver.reassign(task.task_id, "data-9")  # its lease expired and went to another executor
        assert wait_until(lambda: executor.buffers.fills() == [0])
        time.sleep(0.1)
        assert executor.buffers.fills() == [0] and executor.report().running == []
        assert driver.tasks[task.task_id].owner == "data-9" and driver.tasks[task.task_id].state == "running"
        executor.stop()


def test_forward_shuffle_pairs_executor_with_one_trainer(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=2, rows=100)
    job = job_spec(batch_rows=50, trainers=2, shuffle="forward")
    driver = FakeDriver(plan(job, tmp_path, hours=1))
    executor = DataExecutor(driver, job, "data-3", str(tmp_path), serve=False, heartbeat_s=0.05)
    first, second = run_all(executor, trainers=2)
    assert first == [] and len(second) == 4  # data-3 -> trainer 3 mod 2 = 1


def test_served_batches_restore_canonical_columns(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=30)
    job = job_spec(batch_rows=30)
    (task,) = plan(job, tmp_path, hours=1)
    (items,) = run_all(DataExecutor(FakeDriver([task]), job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05))
    canonical = items[0].canonical()
    assert canonical.schema.field("kind").type == pa.dictionary(pa.int32(), pa.string())
    assert set(canonical.column("source").to_pylist()) == {"src"} and items[0].batch_id.first_row == 0
    with pytest.raises(ValueError, match="metadata says"):
        Batch(items[0].columns.slice(1), items[0].meta)


def test_rebalance_sends_more_to_the_trainer_that_keeps_up(tmp_path: Path) -> None:
    ids = write_tree(tmp_path, hours=1, files=2, rows=400)
    job = job_spec(batch_rows=10, trainers=2, buffer_batches=2, shuffle="rebalance")
    executor = DataExecutor(
        FakeDriver(plan(job, tmp_path, hours=1)), job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05
    )
    fast: list[Batch] = []
    slow: list[Batch] = []

    def slow_reader() -> None:
        while (item := executor.take(1)) is not None:
            slow.append(item)
            time.sleep(0.05)

    with executor:
        thread = threading.Thread(target=slow_reader)
        thread.start()
        fast.extend(drain(executor, 0))
        thread.join(20)
    assert sorted(sample_ids(fast) + sample_ids(slow)) == sorted(ids)
    assert len(fast) > 4 * len(slow)


def test_a_finished_task_is_completed_with_the_next_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One round trip per task: a task served completely while the runner reads the next one is
    completed by that runner's next lease, not by a call of its own; each task is completed once.

    A queued completion that waited ``_COMPLETION_DELAY_S`` is sent alone (a runner blocked on a full buffer
    does not lease soon); that timer is switched off here, so what rides with a lease does not depend on how
    fast this machine runs the threads. How many ride still depends on the consumer's pace (a task finished
    while no runner reads goes alone), so the test asks for the mechanism, not a count: the round trips it
    saves show in ``bench/serve.py``."""
    monkeypatch.setattr(data_executor, "_COMPLETION_DELAY_S", math.inf)
    ids = write_tree(tmp_path, hours=2, files=3, rows=120)
    job = job_spec(batch_rows=50, buffer_batches=8)
    tasks = plan(job, tmp_path)

    class Counting(FakeDriver):
        def __init__(self, tasks: list[DataTask]) -> None:
            super().__init__(tasks)
            self.alone: list[str] = []
            self.carried: list[str] = []

        def lease(self, executor_id: str, max_tasks: int = 1, completed=()):  # type: ignore[no-untyped-def]
            self.carried += [done.task_id for done in completed]
            return super().lease(executor_id, max_tasks, completed)

        def complete(self, executor_id: str, task_id: str, rows: int, batches: int) -> None:
            if task_id not in self.carried:
                self.alone.append(task_id)
            super().complete(executor_id, task_id, rows, batches)

    driver = Counting(tasks)
    executor = DataExecutor(driver, job, "data-0", str(tmp_path), serve=False, heartbeat_s=0.05)
    (items,) = run_all(executor)
    assert sorted(sample_ids(items)) == sorted(ids)
    assert all(r.state == "succeeded" and r.rows == 120 and r.batches == 3 for r in driver.tasks.values())
    assert sorted(driver.carried + driver.alone) == sorted(t.task_id for t in tasks)  # each completed once
    assert driver.carried, (driver.carried, driver.alone)

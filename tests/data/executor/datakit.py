"""Shared test kit for executor / reader tests: a Parquet tree, a job spec, a plan, a fake driver.

Imported as ``tests.data.executor.datakit`` (the project root is on ``pythonpath``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from primus_dagster.data.driver.api import Completion, ExecutorReport, Lease
from primus_dagster.data.sources import SourceContext, TimeWindow, make_adapter
from primus_dagster.data.tasks import BatchId, DataTask
from primus_dagster.spec import JobSpec, parse_job_spec

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def native(start: datetime, n: int, first_id: int) -> pa.Table:
    """Native rows: sample_id, event_time, click, d0, d1, user_id."""
    rng = np.random.default_rng(first_id)
    ts = np.datetime64(start.replace(tzinfo=None), "us") + np.sort(rng.integers(0, 3600, n)).astype("timedelta64[s]")
    return pa.table(
        {
            "sample_id": pa.array(np.arange(first_id, first_id + n), pa.int64()),
            "event_time": pa.array(ts, pa.timestamp("us", tz="UTC")),
            "click": pa.array(rng.integers(0, 2, n), pa.int32()),
            "d0": pa.array(rng.random(n, dtype=np.float32), pa.float32()),
            "d1": pa.array(rng.random(n, dtype=np.float32), pa.float32()),
            "user_id": pa.array(rng.integers(0, 100, n), pa.int64()),
        }
    )


def write_tree(
    root: Path, rel: str = "pq", hours: int = 2, files: int = 2, rows: int = 250, first_id: int = 0
) -> list[int]:
    """Hive-layout hourly partitions under ``root/rel`` with ``_SUCCESS``; returns all sample ids."""
    ids: list[int] = []
    next_id = first_id
    for h in range(hours):
        start = T0 + timedelta(hours=h)
        directory = root / rel / f"dt={start:%Y-%m-%d}" / f"hour={start:%H}"
        directory.mkdir(parents=True, exist_ok=True)
        for f in range(files):
            pq.write_table(native(start, rows, next_id), directory / f"part-{f:05d}.parquet")
            ids += list(range(next_id, next_id + rows))
            next_id += rows
        (directory / "_SUCCESS").touch()
    return ids


def wait_until(predicate: Any, timeout: float = 10.0) -> bool:
    """Poll ``predicate()`` until true or ``timeout``; its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(0.01)
    return True


def job_text(
    batch_rows: int = 100,
    trainers: int = 1,
    buffer_batches: int = 4,
    task_runners: int = 2,
    shuffle: str = "rebalance",
    lease: str = "4s",
    stream_source: bool = False,
    replicas: int = 1,
    data_pool: str = "",
    data_plane: str = "",
    top_level: str = "",
) -> str:
    """A job of one Parquet source ``src`` at ``pq`` (and a stream source ``live`` at ``live``);
    ``data_pool`` / ``data_plane`` add keys to ``pools.data`` / ``data``, ``top_level`` whole sections."""
    extra = ""
    if stream_source:
        extra = f"""
    - name: fresh
      window: 2h
      shuffle: {shuffle}
      sources:
        - name: live
          type: parquet
          kind: stream
          path: live
          batch_rows: {batch_rows}
          columns: {{ts: event_time, label: click, id: sample_id, dense: [d0, d1], sparse: [user_id]}}
"""
    return f"""
name: exec-test
pools:
  data: {{replicas: {replicas}, task_runners: {task_runners}{", " + data_pool if data_pool else ""}}}
  training: {{replicas: {trainers}, max_replicas: {max(trainers, 1)}}}
data: {{buffer_batches: {buffer_batches}, lease: {lease}{", " + data_plane if data_plane else ""}}}
{top_level}
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 2h
      shuffle: {shuffle}
      sources:
        - name: src
          type: parquet
          path: pq
          batch_rows: {batch_rows}
          columns: {{ts: event_time, label: click, id: sample_id, dense: [d0, d1], sparse: [user_id]}}
{extra}"""


def job_spec(**kw: Any) -> JobSpec:
    return parse_job_spec(job_text(**kw))


def plan(job: JobSpec, data_root: Path, hours: int = 2) -> list[DataTask]:
    """Every read task of every source over ``hours`` from the dataset start, in order."""
    tasks = []
    for stream, source in job.dataset.all_sources():
        adapter = make_adapter(source, SourceContext(str(data_root)))
        for part in adapter.ready_partitions(TimeWindow.hours_from(job.dataset.start, hours)):
            tasks += [DataTask.for_read(stream.name, source.kind, read) for read in adapter.split(part)]
    return sorted(tasks, key=lambda t: t.order_key)


@dataclass
class _Rec:
    task: DataTask
    state: str = "pending"
    owner: str | None = None
    attempts: int = 0
    rows: int = 0
    batches: int = 0
    errors: list[str] = field(default_factory=list)


class FakeDriver:
    """A minimal thread-safe in-process DriverAPI: lease in order, claim ledger, no expiry."""

    def __init__(self, tasks: list[DataTask], max_attempts: int = 2, trainers: int = 1):
        self._lock = threading.Lock()
        self.tasks = {t.task_id: _Rec(t) for t in tasks}
        self.order = [t.task_id for t in tasks]
        self.max_attempts = max_attempts
        self.trainers = trainers
        self.claimed: dict[str, set[int]] = {t.task_id: set() for t in tasks}
        self.claims: list[tuple[str, BatchId, bool]] = []
        self.reports: dict[str, ExecutorReport] = {}
        self.heartbeats: list[ExecutorReport] = []
        self.consumed: dict[str, list[BatchId]] = {}
        self.leases: list[tuple[str, str]] = []

    def lease(self, executor_id: str, max_tasks: int = 1, completed: Sequence[Completion] = ()) -> list[Lease]:
        for done in completed:
            self.complete(executor_id, done.task_id, done.rows, done.batches)
        with self._lock:
            out = []
            for task_id in self.order:
                rec = self.tasks[task_id]
                if rec.state == "pending" and len(out) < max_tasks:
                    rec.state, rec.owner = "running", executor_id
                    rec.attempts += 1
                    self.leases.append((executor_id, task_id))
                    out.append(
                        Lease(rec.task, rec.attempts, time.monotonic() + 60, tuple(sorted(self.claimed[task_id])))
                    )
            return out

    def heartbeat(self, report: ExecutorReport) -> dict[str, Any]:
        with self._lock:
            self.reports[report.executor_id] = report
            self.heartbeats.append(report)
            cancel = [t for t in report.running if self.tasks[t].owner != report.executor_id]
            return {"cancel": cancel, "done": self._done(), "failed": False}

    def complete(self, executor_id: str, task_id: str, rows: int, batches: int) -> None:
        with self._lock:
            rec = self.tasks[task_id]
            rec.state, rec.rows, rec.batches = "succeeded", rows, batches

    def fail(self, executor_id: str, task_id: str, error: str) -> None:
        with self._lock:
            rec = self.tasks[task_id]
            rec.errors.append(error)
            rec.state = "failed" if rec.attempts >= self.max_attempts else "pending"

    def claim(self, trainer_id: str, batch: BatchId) -> bool:
        with self._lock:
            first = batch.first_row not in self.claimed[batch.task_id]
            self.claimed[batch.task_id].add(batch.first_row)
            self.claims.append((trainer_id, batch, first))
            return first

    def barrier(self, trainer_id: str, consumed: list[BatchId], barrier_id: int) -> dict[str, Any] | None:
        with self._lock:
            self.consumed.setdefault(trainer_id, []).extend(consumed)
            return {"barrier_id": barrier_id, "consumed": len(consumed)}

    def executors(self) -> dict[str, ExecutorReport]:
        with self._lock:
            return dict(self.reports)

    def _done(self) -> bool:
        return all(r.state in ("succeeded", "failed") for r in self.tasks.values())

    def status(self) -> dict[str, Any]:
        with self._lock:
            counts: dict[str, int] = {}
            for r in self.tasks.values():
                counts[r.state] = counts.get(r.state, 0) + 1
            return {"counts": counts, "done": self._done(), "failed": False}

    def requeue(self, task_id: str) -> None:
        """Test hook: the task's lease expired: pending again (claims are kept)."""
        with self._lock:
            rec = self.tasks[task_id]
            rec.state, rec.owner = "pending", None

    def reassign(self, task_id: str, owner: str) -> None:
        """Test hook: the task's lease went to another executor (as after an expiry)."""
        with self._lock:
            rec = self.tasks[task_id]
            rec.state, rec.owner = "running", owner

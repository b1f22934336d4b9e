"""RemoteReader: kind queues, queue policies, claims dropping duplicates, barriers."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_dagster.data.executor import DataExecutor
from primus_dagster.data.reader import QueueStat, RemoteReader, RoundRobin, batch_first
from tests.data.executor.datakit import FakeDriver, job_spec, plan, write_tree


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
        reader = RemoteReader(driver, 0, None, prefetch=16)  # discovered via the driver
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
        RemoteReader(ledger, 0, [a.location, b.location], prefetch=2) as reader,
    ):
        got = [i for batch in reader for i in batch.sample_id.tolist()]
    assert sorted(got) == ids
    assert reader.stats["dropped"] == reader.stats["received"] - reader.stats["yielded"] == 6
    assert sum(first for _, _, first in ledger.claims) == 6


def test_next_batch_times_out_and_rejects_unknown_kinds(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=1, files=1, rows=5)
    driver = FakeDriver(plan(job_spec(), tmp_path, hours=1))  # a pending task nobody runs: never done
    reader = RemoteReader(driver, 0, lambda: [], refresh_s=0.05)
    with pytest.raises(ValueError, match="no queue"):
        reader.next_batch(kind="other")
    with pytest.raises(TimeoutError):
        reader.next_batch(timeout=0.2)
    reader.close()
    assert reader.next_batch() is None  # closed

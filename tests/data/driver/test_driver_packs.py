"""The driver's rules for packs of small files (``docs/data_plane.md``, Packs), on a fake clock.

A file of a pack that fails is counted on its own; after ``max_attempts`` failures (at once when the
error is permanent) it is given up alone and the pack is leased without it -- unless an attempt may
have served rows of it or of a later file, then the pack is given up as one. Given-up files are
reported with their file, count in the failure threshold as files, and survive a snapshot.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from primus_dagster.data.driver import DataDriver, DataFailedError, DriverClient, DriverServer, MemberFailure
from primus_dagster.data.sources.base import ReadTask
from primus_dagster.data.tasks import BatchId, DataTask

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
FILES = [f"/data/imp/dt=2024-03-01/hour=00/part-{i}.parquet" for i in range(4)]


def pack(files: list[str] = FILES) -> DataTask:
    members = tuple((uri, 100, 10) for uri in files)
    read = ReadTask("imp", T0, files[0], size_bytes=100 * len(files), rows=10 * len(files), members=members)
    return DataTask.for_read("history", "batch", read)


def single(index: int) -> DataTask:
    return DataTask.for_read("history", "batch", ReadTask("imp", T0, f"/data/imp/other-{index}.parquet", rows=10))


def fail_file(driver: DataDriver, uri: str, served: int = 0, retryable: bool = True) -> None:
    (lease,) = driver.lease("exec-0")
    assert uri in [m[0] for m in lease.task.read.members]
    member = MemberFailure(uri, retryable, served)
    driver.fail("exec-0", lease.task.task_id, f"{uri}: not a readable Parquet file", member=member)


def test_a_failing_file_is_given_up_alone_and_the_pack_goes_on_without_it(clock) -> None:
    driver = DataDriver(max_attempts=3, failed_task_threshold=0.5, clock=clock)
    task = pack()
    driver.add_tasks([task])
    for attempt in range(3):
        fail_file(driver, FILES[1], served=1)  # rows of the first file served before the failure
        info = driver.task_info(task.task_id)
        assert info["failures"] == 0  # the pack itself did not fail
        assert info["member_failures"] == ({FILES[1]: attempt + 1} if attempt < 2 else {})
    info = driver.task_info(task.task_id)
    assert info["state"] == "pending" and list(info["given_up"]) == [FILES[1]]
    (lease,) = driver.lease("exec-0")
    assert lease.task.task_id == task.task_id  # the same task, its batch ids the same up to the file
    assert [m[0] for m in lease.task.read.members] == [FILES[0], *FILES[2:]]
    assert lease.task.read.rows == 30 and lease.task.size_bytes == 300
    driver.claim("t0", BatchId(task.task_id, 0, 30))
    driver.complete("exec-0", task.task_id, rows=30, batches=1)
    status = driver.status()
    assert status["done"] and not status["failed"]  # 1 file of 4 given up: 25 % < 50 %
    (row,) = driver.failure_report()
    assert row["uri"] == row["where"] == FILES[1] and row["task_id"] == task.task_id
    assert row["failures"] == 3 and FILES[1] in row["error"]
    assert status["failed_tasks"] == [row]


def test_a_permanent_error_gives_the_file_up_at_once(clock) -> None:
    driver = DataDriver(max_attempts=3, failed_task_threshold=0.5, clock=clock)
    task = pack()
    driver.add_tasks([task])
    fail_file(driver, FILES[0], retryable=False)
    info = driver.task_info(task.task_id)
    assert info["state"] == "pending" and list(info["given_up"]) == [FILES[0]]
    (lease,) = driver.lease("exec-0")
    assert lease.task.read.uri == FILES[1] and len(lease.task.read.members) == 3


def test_rows_served_past_the_file_give_the_pack_up_as_one(clock) -> None:
    """An attempt whose lease expired may have served rows of any file: without the failing file the
    batch ids would name other rows, so the pack fails with it (named)."""
    driver = DataDriver(max_attempts=2, failed_task_threshold=1.0, lease_s=10, clock=clock)
    task = pack()
    driver.add_tasks([task])
    driver.lease("exec-0")
    clock.advance(11)  # its executor went silent: the attempt ended, having served who knows what
    assert driver.expire() == [task.task_id]
    for _ in range(2):
        fail_file(driver, FILES[2], served=2)
    info = driver.task_info(task.task_id)
    assert info["state"] == "failed" and not info["given_up"]
    assert FILES[2] in info["error"] and "given up with it" in info["error"]
    (row,) = driver.failure_report()
    assert row["uri"] == FILES[0] and "where" not in row  # the pack: named by its first file


def test_a_file_failing_before_any_served_row_may_go_even_after_an_earlier_attempt(clock) -> None:
    """served_members bounds what ended attempts served: a file at or past it can still go alone."""
    driver = DataDriver(max_attempts=1, failed_task_threshold=1.0, clock=clock)
    task = pack()
    driver.add_tasks([task])
    fail_file(driver, FILES[3], served=2)  # two files' rows served, then file 3 failed: given up alone
    assert list(driver.task_info(task.task_id)["given_up"]) == [FILES[3]]
    fail_file(driver, FILES[1], served=0)  # now file 1: rows of file 1 may have been served before
    info = driver.task_info(task.task_id)
    assert info["state"] == "failed" and list(info["given_up"]) == [FILES[3]]
    rows = driver.failure_report()
    assert [r["uri"] for r in rows] == [FILES[3], FILES[0]]  # the given-up file, then the pack


def test_the_threshold_counts_files(clock) -> None:
    driver = DataDriver(max_attempts=1, failed_task_threshold=0.2, clock=clock)
    task = pack()
    driver.add_tasks([task, single(0), single(1)])  # 4 + 1 + 1 = 6 files
    fail_file(driver, FILES[0])
    assert not driver.status()["failed"]  # 1 of 6 files < 20 %
    fail_file(driver, FILES[1])
    assert driver.status()["failed"]  # 2 of 6 > 20 %
    with pytest.raises(DataFailedError) as failed:
        driver.raise_if_failed()
    assert failed.value.total == 6 and FILES[0] in str(failed.value) and FILES[1] in str(failed.value)


def test_the_last_file_given_up_fails_the_pack(clock) -> None:
    driver = DataDriver(max_attempts=1, failed_task_threshold=1.0, clock=clock)
    task = pack(FILES[:2])
    driver.add_tasks([task])
    fail_file(driver, FILES[0])
    fail_file(driver, FILES[1])
    assert driver.task_info(task.task_id)["state"] == "failed"
    assert [r["uri"] for r in driver.failure_report()] == FILES[:2]  # no row for the empty pack itself
    status = driver.status()
    assert status["done"] and status["counts"]["failed"] == 1  # 2 of 2 files: within a threshold of 100 %


def test_a_snapshot_keeps_given_up_files_and_what_may_have_been_served(clock) -> None:
    driver = DataDriver(max_attempts=1, failed_task_threshold=1.0, clock=clock)
    task, other = pack(), pack([f"/data/imp/dt=2024-03-01/hour=01/part-{i}.parquet" for i in range(3)])
    driver.add_tasks([task, other])
    fail_file(driver, FILES[2], served=1)
    (running,) = driver.lease("exec-0")  # the pack again, running at the snapshot
    assert running.task.task_id == task.task_id
    restored = DataDriver.restore(json.loads(json.dumps(driver.snapshot())), clock=clock)
    info = restored.task_info(task.task_id)
    assert list(info["given_up"]) == [FILES[2]]
    assert info["served_members"] == 4  # running at the barrier: it may have served rows of any file
    assert restored.failure_report() == driver.failure_report()
    leases = restored.lease("exec-1", max_tasks=2)
    assert [m[0] for m in leases[0].task.read.members] == [FILES[0], FILES[1], FILES[3]]
    restored.fail("exec-1", task.task_id, "boom", member=MemberFailure(FILES[0], True, 0))
    assert restored.task_info(task.task_id)["state"] == "failed"  # served rows may follow FILES[0]


def test_quality_per_file_of_a_pack_is_located_by_file(clock) -> None:
    driver = DataDriver(clock=clock)
    task = pack()
    driver.add_tasks([task])
    driver.lease("exec-0")
    places = {FILES[1]: {"dense_invalid": 3}, FILES[3]: {"dense_invalid": 1, "null_label": 2}}
    driver.complete(
        "exec-0", task.task_id, rows=40, batches=1, quality={"dense_invalid": 4, "null_label": 2}, places=places
    )
    located = {"dense_invalid": {FILES[1]: 3, FILES[3]: 1}, "null_label": {FILES[3]: 2}}
    assert driver.quality_counts()["by_location"] == {"imp": located}
    driver.claim("t0", BatchId(task.task_id, 0, 40))
    driver.barrier("t0", [BatchId(task.task_id, 0, 40)], 1)
    restored = DataDriver.restore(json.loads(json.dumps(driver.snapshot())))
    assert restored.quality_counts()["by_location"] == {"imp": located}


def test_file_failures_and_places_travel_over_flight(clock) -> None:
    driver = DataDriver(max_attempts=1, failed_task_threshold=1.0)
    task = pack()
    driver.add_tasks([task, pack([*FILES[:1], "/data/imp/dt=2024-03-01/hour=00/x.parquet"])])
    with DriverServer(driver).serve_in_thread() as server, DriverClient(server.location) as client:
        second, first = client.lease("exec-0", max_tasks=2)  # (the 2-file pack's id sorts first)
        assert first.task == task  # the members travel (as one compact JSON text)
        client.fail("exec-0", first.task.task_id, "torn", member=MemberFailure(FILES[2], True, 1))
        client.complete(
            "exec-0",
            second.task.task_id,
            rows=20,
            batches=1,
            quality={"null_label": 1},
            places={FILES[0]: {"null_label": 1}},
        )
        assert [r["where"] for r in client.failure_report()] == [FILES[2]]
        (again,) = client.lease("exec-0")
        assert FILES[2] not in [m[0] for m in again.task.read.members]
    assert driver.quality_counts()["by_location"]["imp"] == {"null_label": {FILES[0]: 1}}

"""DataDriver state machine: hand-out order, leases, expiry, retries, job failure, claims, barriers."""

from __future__ import annotations

import random

import pytest

from primus_dagster.data.driver import DataDriver, DataFailedError, ExecutorReport
from primus_dagster.data.sources.base import ReadTask
from primus_dagster.data.tasks import BatchId, DataTask


def test_transitions_new_pending_running_succeeded(clock, task_factory):
    driver = DataDriver(clock=clock)
    tasks = [task_factory(i) for i in range(3)]
    assert driver.add_tasks(tasks) == 3
    assert driver.status()["counts"] == {"new": 3, "pending": 0, "running": 0, "succeeded": 0, "failed": 0}
    [lease] = driver.lease("exec-0")
    assert lease.task == tasks[0] and lease.attempt == 1 and lease.claimed_rows == ()
    assert lease.deadline == clock.now + 60.0
    info = driver.task_info(tasks[0].task_id)
    assert info["state"] == "running" and info["owner"] == "exec-0"
    counts = driver.status()["counts"]
    assert counts["running"] == 1 and counts["pending"] + counts["new"] == 2
    driver.complete("exec-0", tasks[0].task_id, rows=4096, batches=4)
    assert driver.task_info(tasks[0].task_id)["state"] == "succeeded"
    for lease in driver.lease("exec-0", max_tasks=5):
        driver.claim("trainer-0", BatchId(lease.task.task_id, 0, 10))
        driver.complete("exec-0", lease.task.task_id, rows=10, batches=1)
    assert not driver.status()["done"]  # every task finished, but the first one's 4 batches are not claimed
    for first_row in range(0, 4096, 1024):
        driver.claim("trainer-0", BatchId(tasks[0].task_id, first_row, 1024))
    status = driver.status()
    assert status["done"] and not status["failed"]
    assert status["counts"]["succeeded"] == 3 and status["rows"] == 4116 and status["batches"] == 6
    assert driver.lease("exec-0") == []


def test_add_tasks_is_idempotent(clock, task_factory):
    driver = DataDriver(clock=clock)
    assert driver.add_tasks([task_factory(0), task_factory(1)]) == 2
    [lease] = driver.lease("e")
    assert driver.add_tasks([task_factory(0), task_factory(1), task_factory(2)]) == 1
    assert driver.status()["total"] == 3
    assert driver.task_info(lease.task.task_id)["state"] == "running"


@pytest.mark.parametrize("window", [1, 2, 1024])
def test_leases_in_chronological_order(clock, task_factory, window):
    driver = DataDriver(clock=clock, pending_window=window)
    tasks = [task_factory(i, hour=i // 2, stream="s" + str(i % 2)) for i in range(12)]
    shuffled = tasks[:]
    random.Random(7).shuffle(shuffled)
    driver.add_tasks(shuffled[:8])
    first = [driver.lease("e")[0].task for _ in range(3)]
    assert first == sorted(shuffled[:8], key=lambda t: t.order_key)[:3]
    driver.add_tasks(shuffled[8:])  # later arrivals, some earlier than queued ones: still first
    rest = [lease.task for lease in driver.lease("e", max_tasks=100)]
    remaining = sorted(set(tasks) - set(first), key=lambda t: t.order_key)
    assert rest == remaining
    assert driver.status()["counts"]["pending"] == 0


def test_lease_expiry_retries_then_fails(clock, task_factory):
    driver = DataDriver(max_attempts=3, lease_s=10, failed_task_threshold=1.0, clock=clock)
    task = task_factory(0)
    driver.add_tasks([task])
    for attempt in (1, 2, 3):
        [lease] = driver.lease(f"exec-{attempt}")
        assert lease.attempt == attempt
        clock.advance(9.9)
        assert driver.expire() == []
        clock.advance(0.2)
        assert driver.expire() == [task.task_id]
        info = driver.task_info(task.task_id)
        assert info["failures"] == attempt and "lease expired" in info["error"] and f"exec-{attempt}" in info["error"]
        assert info["state"] == ("failed" if attempt == 3 else "pending")
    assert driver.lease("exec-9") == []
    assert driver.status()["counts"]["failed"] == 1


def test_expiry_runs_on_every_call(clock, task_factory):
    driver = DataDriver(lease_s=5, clock=clock)
    driver.add_tasks([task_factory(0)])
    [first] = driver.lease("a")
    clock.advance(6)
    [again] = driver.lease("b")  # the lease call itself expired a's lease
    assert again.task == first.task and again.attempt == 2


def test_heartbeat_extends_and_cancels_lost_tasks(clock, task_factory):
    driver = DataDriver(lease_s=10, clock=clock)
    driver.add_tasks([task_factory(0), task_factory(1)])
    [a] = driver.lease("a")
    [b] = driver.lease("b")
    for _ in range(5):
        clock.advance(8)
        reply = driver.heartbeat(ExecutorReport("a", "grpc://a:1", running=[a.task.task_id], metrics={"cpu": 0.5}))
        assert reply["cancel"] == [] and reply["deadline"] == clock.now + 10 and not reply["done"]
    assert driver.task_info(a.task.task_id)["state"] == "running"
    assert driver.task_info(b.task.task_id)["state"] == "pending"  # b never heartbeated
    # a reports b's task and an unknown one: not its own, cancel them
    reply = driver.heartbeat(ExecutorReport("a", "grpc://a:1", running=[a.task.task_id, b.task.task_id, "nope"]))
    assert reply["cancel"] == [b.task.task_id, "nope"]
    [b2] = driver.lease("c")
    assert b2.task == b.task
    reply = driver.heartbeat(ExecutorReport("b", "grpc://b:1", running=[b.task.task_id]))
    assert reply["cancel"] == [b.task.task_id]  # b lost it to c
    assert driver.executors()["a"].address == "grpc://a:1"
    assert set(driver.executors()) == {"a", "b", "c"}
    clock.advance(11)
    assert "a" not in driver.executors()


def test_fail_retries_until_max_attempts_and_keeps_error(clock, task_factory):
    driver = DataDriver(max_attempts=3, failed_task_threshold=1.0, clock=clock)
    task = task_factory(0)
    driver.add_tasks([task])
    for attempt in (1, 2, 3):
        [_lease] = driver.lease("e")
        driver.fail("other", task.task_id, "ignored: not the owner")
        assert driver.task_info(task.task_id)["state"] == "running"
        driver.fail("e", task.task_id, f"boom {attempt}")
        driver.fail("e", task.task_id, "a repeated report is ignored")
    info = driver.task_info(task.task_id)
    assert info["state"] == "failed" and info["failures"] == 3 and info["attempts"] == 3
    assert "boom 3" in info["error"]


def test_job_fails_past_threshold_with_report(clock, task_factory):
    driver = DataDriver(max_attempts=1, failed_task_threshold=0.1, clock=clock)
    tasks = [task_factory(i) for i in range(10)]
    driver.add_tasks(tasks)
    leases = driver.lease("e", max_tasks=10)
    driver.fail("e", leases[0].task.task_id, "SourceReadError: corrupt footer")
    assert not driver.status()["failed"]  # 1/10 is not more than 10 %
    driver.raise_if_failed()
    driver.fail("e", leases[1].task.task_id, "PermissionError: denied")
    status = driver.status()
    assert status["failed"] and not status["done"]
    report = {row["task_id"]: row for row in status["failed_tasks"]}
    assert set(report) == {tasks[0].task_id, tasks[1].task_id}
    row = report[tasks[0].task_id]
    assert row["uri"] == tasks[0].read.uri and row["attempts"] == 1 and "corrupt footer" in row["error"]
    with pytest.raises(DataFailedError) as caught:
        driver.raise_if_failed()
    assert tasks[1].read.uri in str(caught.value) and "denied" in str(caught.value)
    assert len(caught.value.report) == 2
    driver.add_tasks([task_factory(99)])
    assert driver.lease("e") == []  # no hand-out once the job failed
    assert driver.heartbeat(ExecutorReport("e", ""))["failed"]


def test_done_tolerates_failures_within_threshold(clock, task_factory):
    driver = DataDriver(max_attempts=1, failed_task_threshold=0.5, clock=clock)
    driver.add_tasks([task_factory(0), task_factory(1)])
    a, b = driver.lease("e", max_tasks=2)
    driver.fail("e", a.task.task_id, "x")
    driver.claim("trainer-0", BatchId(b.task.task_id, 0, 1))
    driver.complete("e", b.task.task_id, 1, 1)
    assert driver.status()["done"] and not driver.status()["failed"]


def test_a_job_of_zero_tasks_is_done_at_once_but_not_before_its_tasks_are_added(clock):
    driver = DataDriver(clock=clock)
    assert not driver.status()["done"]  # nothing planned yet: executors and readers keep waiting
    assert driver.add_tasks([]) == 0
    status = driver.status()
    assert status["done"] and not status["failed"] and driver.lease("e") == []
    assert DataDriver.restore(driver.snapshot()).status()["done"]


def test_complete_edge_cases(clock, task_factory):
    driver = DataDriver(lease_s=5, max_attempts=1, failed_task_threshold=1.0, clock=clock)
    t0, t1 = task_factory(0), task_factory(1)
    driver.add_tasks([t0, t1])
    driver.lease("a")
    clock.advance(6)
    driver.expire()  # max_attempts=1: t0 failed
    driver.complete("a", t0.task_id, 1, 1)  # late completion of a failed task: ignored
    assert driver.task_info(t0.task_id)["state"] == "failed"
    [_lease] = driver.lease("b")
    driver.complete("late", t1.task_id, 8, 2)  # another executor finished it: accepted
    driver.complete("b", t1.task_id, 8, 2)  # idempotent
    assert driver.task_info(t1.task_id)["state"] == "succeeded" and driver.status()["rows"] == 8
    with pytest.raises(KeyError, match="unknown data task"):
        driver.complete("a", "missing", 1, 1)


def test_claim_dedup_and_claimed_rows_on_relase(clock, task_factory):
    driver = DataDriver(lease_s=5, clock=clock)
    task = task_factory(0)
    driver.add_tasks([task])
    [_lease] = driver.lease("a")
    assert driver.claim("t0", BatchId(task.task_id, 0, 100))
    assert not driver.claim("t1", BatchId(task.task_id, 0, 100))  # served twice: dropped
    assert driver.claim_many(
        "t0", [BatchId(task.task_id, 200, 100), BatchId(task.task_id, 100, 100), BatchId(task.task_id, 200, 100)]
    ) == [True, True, False]
    clock.advance(6)
    [again] = driver.lease("b")
    assert again.attempt == 2 and again.claimed_rows == (0, 100, 200)
    assert driver.status()["claimed_batches"] == 3
    with pytest.raises(KeyError):
        driver.claim("t0", BatchId("missing", 0, 1))


def test_barrier_waits_for_every_trainer(clock, task_factory):
    driver = DataDriver(trainers=2, clock=clock)
    task = task_factory(0)
    driver.add_tasks([task])
    driver.lease("e")
    b0, b1 = BatchId(task.task_id, 0, 10), BatchId(task.task_id, 10, 10)
    assert driver.claim("t0", b0) and driver.claim("t1", b1)
    assert driver.barrier("t0", [b0], barrier_id=1) is None
    assert driver.barrier("t0", [], barrier_id=1) is None  # polling: still waiting for t1
    with pytest.raises(ValueError, match="still waiting"):
        driver.barrier("t0", [], barrier_id=2)
    snap = driver.barrier("t1", [b1], barrier_id=1)
    assert snap is not None and snap["barrier_id"] == 1
    [entry] = snap["tasks"]
    assert entry["consumed"] == [0, 10] and entry["consumed_rows"] == 20 and entry["state"] == "running"
    assert driver.barrier("t0", [], barrier_id=1) == snap  # every later caller of barrier 1
    assert driver.barrier_snapshot() == snap
    with pytest.raises(ValueError, match="not newer"):
        driver.barrier("t0", [], barrier_id=0)
    assert driver.barrier("t0", [], barrier_id=2) is None
    assert driver.status()["barrier_id"] == 1 and driver.status()["consumed_batches"] == 2
    with pytest.raises(KeyError):
        driver.barrier("t1", [BatchId("missing", 0, 1)], barrier_id=2)


def test_consumed_done_counts(clock, task_factory):
    driver = DataDriver(clock=clock)
    task = task_factory(0)
    driver.add_tasks([task])
    driver.lease("e")
    batches = [BatchId(task.task_id, r, 50) for r in (0, 50)]
    driver.barrier("t0", batches[:1], 1)
    driver.complete("e", task.task_id, rows=100, batches=2)
    assert driver.status()["consumed_done"] == 0
    driver.barrier("t0", batches[1:], 2)
    assert driver.status()["consumed_done"] == 1 and driver.task_info(task.task_id)["consumed_done"]


def test_bad_config_rejected():
    with pytest.raises(ValueError, match="bad driver config"):
        DataDriver(max_attempts=0)


def test_completed_task_reopened_when_its_executor_dies_before_delivery(clock, task_factory):
    """Flight DoGet has no acknowledgement: a batch handed to the stream can be lost when the
    executor is killed right after ``complete``. The driver reopens such a task once the owner
    misses its heartbeats, and the re-lease skips what readers did claim."""
    driver = DataDriver(lease_s=5, clock=clock)
    lost, delivered = task_factory(0), task_factory(1)
    driver.add_tasks([lost, delivered])
    leases = driver.lease("a", max_tasks=2)
    assert len(leases) == 2
    driver.claim("t0", BatchId(lost.task_id, 0, 100))  # batch 100 never reaches a reader
    driver.complete("a", lost.task_id, rows=200, batches=2)
    for first_row in (0, 100):
        driver.claim("t0", BatchId(delivered.task_id, first_row, 100))
    driver.complete("a", delivered.task_id, rows=200, batches=2)
    driver.heartbeat(ExecutorReport("b", "grpc://b"))
    clock.advance(4)
    driver.heartbeat(ExecutorReport("b", "grpc://b"))
    assert not driver.status()["done"]  # executor a is alive: its batch may be in flight, the run goes on
    clock.advance(2)  # a is silent for more than lease_s: dead
    [again] = driver.lease("b")
    assert again.task.task_id == lost.task_id and again.claimed_rows == (0,)
    assert driver.task_info(delivered.task_id)["state"] == "succeeded"
    assert "died before all batches were claimed" in driver.task_info(lost.task_id)["error"]


def test_backlog_by_kind_counts_unread_tasks_and_follows_a_restore(clock, task_factory):
    from dataclasses import replace

    driver = DataDriver(clock=clock)
    batch = [task_factory(i) for i in range(2)]
    stream = [replace(task_factory(10 + i), kind="stream") for i in range(3)]
    driver.add_tasks(batch + stream)
    assert driver.backlog_by_kind() == {"batch": 2, "stream": 3}
    for lease in driver.lease("exec-0", max_tasks=3):  # chronological: both batch tasks, one stream task
        driver.complete("exec-0", lease.task.task_id, rows=10, batches=1)
    assert driver.backlog_by_kind() == {"batch": 0, "stream": 2}
    # Nothing was consumed at a barrier: a restore re-runs every task, so all are backlog again.
    assert DataDriver.restore(driver.snapshot()).backlog_by_kind() == {"batch": 2, "stream": 3}


def test_abort_fails_the_job_from_outside(clock, task_factory):
    from primus_dagster.data.driver import DataAbortedError

    driver = DataDriver(clock=clock)
    driver.add_tasks([task_factory(0), task_factory(1)])
    driver.lease("exec-0")
    driver.abort("data-1 ended 4 times (max_restarts 3): disk on fire")
    driver.abort("a second reason is ignored")
    status = driver.status()
    assert status["failed"] and not status["done"] and status["aborted"].startswith("data-1 ended 4 times")
    assert driver.heartbeat(ExecutorReport("exec-0", "grpc://x:1"))["failed"]
    with pytest.raises(DataAbortedError, match="disk on fire"):
        driver.raise_if_failed()


def _finish_quickly(driver, clock, tasks, executor="fast", seconds=1.0):
    for task in tasks:
        [lease] = driver.lease(executor)
        assert lease.task == task
        clock.advance(seconds)
        driver.complete(executor, task.task_id, rows=10, batches=1)


def test_a_straggler_gets_a_backup_copy_and_the_first_to_finish_wins(clock, task_factory):
    driver = DataDriver(clock=clock, lease_s=60, backup_after=6.0)
    slow_task, *quick = [task_factory(i) for i in range(6)]
    driver.add_tasks([slow_task, *quick])
    [slow] = driver.lease("slow")
    _finish_quickly(driver, clock, quick)  # 5 tasks of 1 s: median 1 s
    assert driver.lease("fast") == []  # the slow one has run 5 s: not yet 6 x the median
    clock.advance(5)  # now 10 s > 6 x median
    [backup] = driver.lease("fast")
    assert backup.task == slow.task and driver.task_info(slow.task.task_id)["backup"] == "fast"
    assert driver.lease("third") == []  # one backup per task
    assert driver.heartbeat(ExecutorReport("fast", "grpc://f:1", running=[slow.task.task_id]))["cancel"] == []
    driver.complete("fast", slow.task.task_id, rows=10, batches=1)
    assert driver.status()["backups_started"] == 1 and driver.status()["backups_won"] == 1
    cancel = driver.heartbeat(ExecutorReport("slow", "grpc://s:1", running=[slow.task.task_id]))["cancel"]
    assert cancel == [slow.task.task_id]  # the original copy stops: its output is delivered already
    driver.complete("slow", slow.task.task_id, rows=10, batches=1)  # late: ignored
    assert driver.task_info(slow.task.task_id)["owner"] == "fast"


def test_a_backup_takes_over_when_the_original_copy_dies_and_backups_can_be_off(clock, task_factory):
    driver = DataDriver(clock=clock, lease_s=60, backup_after=2.0)
    slow_task, *quick = [task_factory(i) for i in range(6)]
    driver.add_tasks([slow_task, *quick])
    [slow] = driver.lease("slow")
    _finish_quickly(driver, clock, quick)
    clock.advance(10)
    [_backup] = driver.lease("fast")
    driver.fail("fast", slow.task.task_id, "backup copy failed")  # the original goes on, no failure counted
    assert (
        driver.task_info(slow.task.task_id)["failures"] == 0 and driver.task_info(slow.task.task_id)["backup"] is None
    )
    [again] = driver.lease("fast")
    assert again.task == slow.task
    clock.advance(61)  # the original's lease expires: the backup owns the task now, nothing re-queued
    driver.expire()
    info = driver.task_info(slow.task.task_id)
    assert info["owner"] == "fast" and info["state"] == "running" and info["failures"] == 0

    off = DataDriver(clock=clock, lease_s=600, backup_after=0.0)
    slow_task, *quick = [task_factory(i) for i in range(10, 16)]
    off.add_tasks([slow_task, *quick])
    off.lease("slow")
    _finish_quickly(off, clock, quick)
    clock.advance(100)
    assert off.lease("fast") == []


def test_release_hands_unfinished_tasks_out_again_without_a_failure(clock, task_factory):
    driver = DataDriver(clock=clock, lease_s=60)
    a, b = task_factory(0), task_factory(1)
    driver.add_tasks([a, b])
    driver.lease("leaving", max_tasks=2)
    assert driver.release("someone-else", [a.task_id]) == []
    assert driver.release("leaving", [a.task_id, b.task_id, "unknown"]) == [a.task_id, b.task_id]
    info = driver.task_info(a.task_id)
    assert info["state"] == "pending" and info["failures"] == 0
    [again, _] = driver.lease("staying", max_tasks=2)  # at once, not after the 60 s lease
    assert again.task == a and again.attempt == 2


def test_quality_counts_name_the_file_or_the_kafka_offset_range(clock, task_factory):
    driver = DataDriver(clock=clock)
    files = [task_factory(i) for i in range(2)]
    kafka = DataTask.for_read("live", "stream", ReadTask("clicks", files[0].partition, "clicks:3", 100, 600, rows=500))
    driver.add_tasks([*files, kafka])
    quality = {
        files[0].task_id: {"dense_invalid": 4},
        files[1].task_id: {"dense_invalid": 1, "null_label": 2},
        kafka.task_id: {"bad_id": 5},
    }
    for lease in driver.lease("exec-0", max_tasks=3):
        driver.complete("exec-0", lease.task.task_id, rows=10, batches=1, quality=quality[lease.task.task_id])
    places = driver.quality_counts(offset_sources={"clicks"})["by_location"]
    assert places == {
        "clicks": {"bad_id": {"topic clicks partition 3 offsets 100-600": 5}},
        "events": {
            "dense_invalid": {files[0].read.uri: 4, files[1].read.uri: 1},
            "null_label": {files[1].read.uri: 2},
        },
    }
    assert driver.quality_counts()["by_location"]["clicks"] == {"bad_id": {"clicks:3 row groups 100-600": 5}}

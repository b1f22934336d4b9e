"""The driver's end-of-run delivery audit and the liveness of executors, on a fake clock."""

from __future__ import annotations

import logging

import pytest

from primus_dagster.data.driver import DataDriver, DataFailedError, ExecutorReport
from primus_dagster.data.tasks import BatchId, DataTask

ROWS = 100  # rows per batch of these tasks


def claim(driver: DataDriver, task: DataTask, *first_rows: int) -> list[bool]:
    return [driver.claim("trainer-0", BatchId(task.task_id, row, ROWS)) for row in first_rows]


def test_batches_a_reader_dropped_are_served_again_after_a_lease_without_claims(clock, task_factory):
    driver = DataDriver(lease_s=5, clock=clock)
    dropped, delivered = task_factory(0), task_factory(1)
    driver.add_tasks([dropped, delivered])
    driver.lease("a", max_tasks=2)
    claim(driver, dropped, 0)  # batches 100 and 200 went to a client that never claimed them
    driver.complete("a", dropped.task_id, rows=3 * ROWS, batches=3)
    claim(driver, delivered, 0, 100)
    driver.complete("a", delivered.task_id, rows=2 * ROWS, batches=2)
    clock.advance(4.9)
    driver.heartbeat(ExecutorReport("a", "grpc://a"))  # the executor is alive: only the audit can find the loss
    status = driver.status()
    assert not status["done"] and status["counts"]["succeeded"] == 2  # a batch may still be in flight
    clock.advance(0.2)  # a lease without any claim, every task finished: the audit
    assert driver.expire() == [dropped.task_id]
    info = driver.task_info(dropped.task_id)
    assert info["state"] == "pending" and info["failures"] == 1
    assert "2 of 3 batches" in info["error"] and dropped.read.uri in info["error"] and "never claimed" in info["error"]
    assert driver.task_info(delivered.task_id)["state"] == "succeeded"
    assert driver.status()["rows"] == 2 * ROWS  # the reopened task's rows are counted again when it completes
    [again] = driver.lease("a")
    assert again.task.task_id == dropped.task_id and again.claimed_rows == (0,)  # only the lost batches again
    assert claim(driver, dropped, 100, 200) == [True, True]
    driver.complete("a", dropped.task_id, rows=3 * ROWS, batches=3)
    status = driver.status()
    assert status["done"] and status["rows"] == 5 * ROWS and status["claimed_batches"] == 5


def test_the_audit_waits_while_tasks_run_or_claims_come(clock, task_factory):
    driver = DataDriver(lease_s=5, clock=clock)
    first, second = task_factory(0), task_factory(1)
    driver.add_tasks([first, second])
    driver.lease("a", max_tasks=2)
    driver.complete("a", first.task_id, rows=2 * ROWS, batches=2)
    for _ in range(4):  # the second task runs (its lease kept by heartbeats): the run has not ended
        clock.advance(3)
        driver.heartbeat(ExecutorReport("a", "grpc://a", running=[second.task_id]))
    assert driver.task_info(first.task_id)["state"] == "succeeded"
    driver.complete("a", second.task_id, rows=ROWS, batches=1)
    for row in (0, 100):  # a slow trainer: its claims keep coming, each within a lease
        clock.advance(4)
        driver.heartbeat(ExecutorReport("a", "grpc://a"))
        claim(driver, first, row)
    clock.advance(4)
    claim(driver, second, 0)
    assert driver.status()["done"] and driver.task_info(first.task_id)["failures"] == 0


def test_a_task_whose_batches_are_lost_every_time_fails_by_name(clock, task_factory):
    driver = DataDriver(lease_s=5, max_attempts=2, failed_task_threshold=0.0, clock=clock)
    task = task_factory(0)
    driver.add_tasks([task])
    for _ in range(2):
        driver.lease("a")
        driver.complete("a", task.task_id, rows=ROWS, batches=1)  # its one batch never claimed
        clock.advance(5)
        driver.heartbeat(ExecutorReport("a", "grpc://a"))
    status = driver.status()
    assert status["failed"] and not status["done"]
    with pytest.raises(DataFailedError, match="never claimed") as err:
        driver.raise_if_failed()
    assert task.read.uri in str(err.value) and "1 of 1 batches" in str(err.value)


def test_a_silent_executor_loses_its_leases_and_is_named(clock, task_factory, caplog):
    driver = DataDriver(lease_s=5, clock=clock)
    tasks = [task_factory(i) for i in range(3)]
    driver.add_tasks(tasks)
    held = driver.lease("frozen", max_tasks=2)
    for _ in range(2):  # "frozen" stops heartbeating (SIGSTOP); "live" goes on
        clock.advance(3)
        driver.heartbeat(ExecutorReport("live", "grpc://live"))
    with caplog.at_level(logging.WARNING, logger="primus_dagster.data.driver.state"):
        status = driver.status()
    assert status["counts"]["pending"] + status["counts"]["new"] == 3 and status["silent_executors"] == ["frozen"]
    assert any(
        "executor frozen is silent" in r.getMessage() and held[0].task.task_id in r.getMessage() for r in caplog.records
    )
    again = driver.lease("live", max_tasks=3)
    assert [lease.task for lease in again] == tasks
    # Back from SIGCONT: its heartbeat is told to cancel what it lost; its late completion is accepted (same output).
    answer = driver.heartbeat(ExecutorReport("frozen", "grpc://frozen", running=[held[0].task.task_id]))
    assert answer["cancel"] == [held[0].task.task_id] and driver.status()["silent_executors"] == []

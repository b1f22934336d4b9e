"""DriverServer / DriverClient over loopback Arrow Flight: every action, token, errors, retries, expiry timer."""

from __future__ import annotations

import json
import threading
import time

import pyarrow.flight as flight
import pytest

from primus_dagster.data.driver import (
    Completion,
    DataDriver,
    DataFailedError,
    DriverClient,
    DriverServer,
    DriverUnavailableError,
    ExecutorReport,
)
from primus_dagster.data.driver.actions import ACTIONS
from primus_dagster.data.tasks import BatchId


@pytest.fixture
def served(clock):
    driver = DataDriver(max_attempts=2, failed_task_threshold=0.3, lease_s=10, trainers=2, clock=clock)
    with DriverServer(driver) as server, DriverClient(server.location, retry_s=2) as client:
        yield driver, server, client


def test_every_action_round_trips(served, clock, task_factory):
    driver, server, client = served
    assert server.location.startswith("grpc://127.0.0.1:")
    tasks = [task_factory(i) for i in range(4)]
    assert client.add_tasks(tasks) == 4 and client.add_tasks(tasks[:1]) == 0
    assert client.status()["counts"]["new"] == 4
    client.source_versions = {"history": {"delta_version": 3}}
    assert client.source_versions == {"history": {"delta_version": 3}} == driver.source_versions

    a, b = client.lease("exec-a", max_tasks=2)
    assert a.task == tasks[0] and b.task == tasks[1] and a.attempt == 1 and a.deadline == clock.now + 10
    reply = client.heartbeat(
        ExecutorReport("exec-a", "grpc://127.0.0.1:1", running=[a.task.task_id, "gone"], metrics={"rows_per_s": 12.5})
    )
    assert reply["cancel"] == ["gone"] and reply["done"] is False and reply["failed"] is False
    assert client.executors()["exec-a"] == ExecutorReport(
        "exec-a", "grpc://127.0.0.1:1", [a.task.task_id, "gone"], {"rows_per_s": 12.5}
    )
    b0, b1 = BatchId(a.task.task_id, 0, 64), BatchId(a.task.task_id, 64, 64)
    assert client.claim("t0", b0) is True and client.claim("t1", b0) is False
    assert client.claim_many("t1", [b1, b0]) == [True, False]
    client.complete("exec-a", a.task.task_id, rows=128, batches=2)
    client.fail("exec-a", b.task.task_id, "disk full")
    info = client.task_info(b.task.task_id)
    assert info["state"] == "pending" and "disk full" in info["error"]

    assert client.barrier("t0", [b0], barrier_id=1) is None
    snap = client.barrier("t1", [b1], barrier_id=1)
    assert snap == driver.barrier_snapshot() == client.barrier_snapshot()
    assert snap["source_versions"] == {"history": {"delta_version": 3}}
    assert client.snapshot()["barrier_id"] == 1 and client.task_info(a.task.task_id)["consumed_done"]

    clock.advance(11)
    assert client.expire() == []  # b went back to pending already; nothing else running
    [again] = client.lease("exec-b")
    assert again.task == b.task and again.attempt == 2
    client.fail("exec-b", b.task.task_id, "disk full again")
    assert client.failure_report() == [
        {
            "task_id": b.task.task_id,
            "uri": b.task.read.uri,
            "attempts": 2,
            "failures": 2,
            "error": "disk full again (executor exec-b, attempt 2)",
        }
    ]
    client.raise_if_failed()  # 1 of 4 is within 30 %
    raw = flight.FlightClient(server.location)
    assert {a.type for a in raw.list_actions()} == set(ACTIONS)
    raw.close()


def test_errors_come_back_typed(served, task_factory):
    driver, _server, client = served
    driver.add_tasks([task_factory(0), task_factory(1)])
    with pytest.raises(KeyError, match="unknown data task 'missing'"):
        client.complete("e", "missing", 1, 1)
    with pytest.raises(ValueError, match="unknown data driver action"):
        client.call("no_such_action")
    assert client.barrier("t0", [], 5) is None
    with pytest.raises(ValueError, match="still waiting"):
        client.barrier("t0", [], 6)
    for attempt in (1, 2):
        for lease in client.lease("e", max_tasks=2):
            assert lease.attempt == attempt
            client.fail("e", lease.task.task_id, "corrupt" if attempt == 1 else "corrupt for good")
    assert client.status()["failed"]
    with pytest.raises(DataFailedError) as caught:
        client.raise_if_failed()
    assert caught.value.total == 2 and {r["error"] for r in caught.value.report} == {
        "corrupt for good (executor e, attempt 2)"
    }


def test_retried_claim_gets_the_first_answer(served, task_factory):
    driver, server, client = served
    task = task_factory(0)
    driver.add_tasks([task])
    raw = flight.FlightClient(server.location)
    body = json.dumps(
        {"trainer_id": "t0", "request_id": "r-1", "batch": {"task_id": task.task_id, "first_row": 0, "rows": 8}}
    ).encode()
    answers = [
        json.loads(b"".join(r.body.to_pybytes() for r in raw.do_action(flight.Action("claim", body)))) for _ in range(2)
    ]
    assert answers == [{"first": True}, {"first": True}]  # same request id: the retry is not a second claim
    assert client.claim("t1", BatchId(task.task_id, 0, 8)) is False
    raw.close()


def test_large_responses_are_chunked(served, task_factory):
    _driver, _server, client = served
    tasks = [task_factory(i, pad="x" * 600) for i in range(2500)]  # ~2.5 MB of JSON; add_tasks in 2 chunks
    assert client.add_tasks(tasks) == 2500
    snap = client.snapshot()
    assert len(json.dumps(snap)) > 2 * (1 << 20) and len(snap["tasks"]) == 2500
    assert len(client.lease("e", max_tasks=2500)) == 2500


def test_token_required(clock, task_factory):
    driver = DataDriver(clock=clock)
    with DriverServer(driver, token="s3cret") as server:
        with pytest.raises(flight.FlightUnauthenticatedError):
            DriverClient(server.location, retry_s=0.2).status()
        with pytest.raises(flight.FlightUnauthenticatedError):
            DriverClient(server.location, token="wrong", retry_s=0.2).status()
        client = DriverClient(server.location, token="s3cret")
        assert client.add_tasks([task_factory(0)]) == 1 and client.status()["total"] == 1


def test_unreachable_driver_names_the_address(clock):
    server = DriverServer(DataDriver(clock=clock))
    location = server.location
    server.shutdown()
    server.shutdown()  # idempotent
    client = DriverClient(location, retry_s=0.3)
    start = time.monotonic()
    with pytest.raises(DriverUnavailableError, match=f"data driver at {location} unreachable"):
        client.status()
    assert time.monotonic() - start < 3


def test_expiry_timer_returns_overdue_tasks(task_factory):
    driver = DataDriver(lease_s=0.2)  # real clock: the server's timer runs every 0.05 s
    with DriverServer(driver) as server:
        client = DriverClient(server.location)
        client.add_tasks([task_factory(0)])
        [lease] = client.lease("e")
        deadline = time.monotonic() + 5
        while client.task_info(lease.task.task_id)["state"] != "pending":  # task_info does not expire
            assert time.monotonic() < deadline, "the expiry timer did not run"
            time.sleep(0.05)
        assert "lease expired" in client.task_info(lease.task.task_id)["error"]


def test_concurrent_claims_yield_each_batch_once(served, task_factory):
    driver, server, _ = served
    task = task_factory(0)
    driver.add_tasks([task])
    batches = [BatchId(task.task_id, r * 10, 10) for r in range(100)]
    wins: list[int] = []

    def reader(i: int) -> None:
        client = DriverClient(server.location)
        half = len(batches) // 2
        won = client.claim_many(f"t{i}", batches[:half]) + [client.claim(f"t{i}", b) for b in batches[half:]]
        wins.append(sum(won))
        client.close()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(wins) == len(batches) and driver.status()["claimed_batches"] == len(batches)


def test_a_lease_carries_the_executors_completed_tasks(served, task_factory):
    """One round trip per task: the completions an executor queued ride with its next lease, in order,
    exactly as separate ``complete`` calls (quality counts included); a retried lease applies them once."""
    driver, _, client = served
    tasks = [task_factory(i) for i in range(3)]
    client.add_tasks(tasks)
    first = client.lease("exec-a")
    done = Completion(first[0].task.task_id, rows=10, batches=1, quality={"null_label": 2})
    second = client.lease("exec-a", completed=[done])
    assert [lease.task.task_id for lease in second] == [tasks[1].task_id]
    info = driver.task_info(tasks[0].task_id)
    assert info["state"] == "succeeded" and info["rows"] == 10 and driver.quality_counts()["total"] == {"null_label": 2}
    assert driver.lease("exec-b", completed=[Completion(second[0].task.task_id, rows=5, batches=1)])[
        0
    ].task.task_id == (tasks[2].task_id)
    assert driver.task_info(tasks[1].task_id)["state"] == "succeeded"

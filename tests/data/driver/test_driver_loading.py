"""DataDriver and the mixture prioritisation's loading side: hand-out order across kinds, the
loading policy hook, and the serving buffers' rows (heartbeats + arrived stream rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from primus_dagster.data.driver import DataDriver, ExecutorReport
from primus_dagster.data.tasks import DataTask


def stream_task(task: DataTask, rows: int = 500) -> DataTask:
    """``task`` as a Kafka offset-range task of kind stream with ``rows`` rows."""
    read = replace(task.read, source="clicks", uri=task.read.uri.replace("events", "clicks"), rows=rows)
    return DataTask.for_read("live", "stream", read)


class Recorder:
    """A loading policy that records what the driver shows it and picks a fixed kind when it can."""

    def __init__(self, prefer: str) -> None:
        self.prefer = prefer
        self.calls: list[tuple[list[str], dict[str, int], dict[str, float]]] = []

    def __call__(self, candidates: Sequence[str], running: Mapping[str, int], buffered: Mapping[str, float]) -> str:
        self.calls.append((list(candidates), dict(running), dict(buffered)))
        return self.prefer if self.prefer in candidates else candidates[0]


def test_without_a_policy_kinds_are_handed_out_chronologically(clock, task_factory):
    batch = [task_factory(i, hour=2 * i) for i in range(4)]
    stream = [stream_task(task_factory(i, hour=2 * i + 1)) for i in range(4)]
    driver = DataDriver(clock=clock, pending_window=1)
    driver.add_tasks(stream + batch)
    leased = [lease.task for lease in driver.lease("e", max_tasks=8)]
    assert leased == sorted(batch + stream, key=lambda t: t.order_key)
    assert [t.kind for t in leased] == ["batch", "stream"] * 4


def test_the_policy_picks_the_kind_and_sees_candidates_running_and_rows(clock, task_factory):
    batch = [task_factory(i, hour=i) for i in range(3)]
    stream = [stream_task(task_factory(10 + i, hour=10 + i), rows=500) for i in range(2)]
    policy = Recorder("stream")
    driver = DataDriver(clock=clock, pending_window=1, loading_policy=policy)
    driver.add_tasks(batch + stream)
    driver.heartbeat(ExecutorReport("e", "", metrics={"buffered_rows.batch": 300.0, "buffered_rows.stream": 20.0}))
    first, second, third = (driver.lease("e")[0].task for _ in range(3))
    assert (first.kind, second.kind, third.kind) == ("stream", "stream", "batch")
    assert third == batch[0]  # within a kind the order stays chronological
    # batch's first task is the earlier one; the stream's 1000 arrived rows count into its buffer
    assert policy.calls[0] == (["batch", "stream"], {}, {"batch": 300.0, "stream": 1020.0})
    assert policy.calls[1] == (["batch", "stream"], {"stream": 1}, {"batch": 300.0, "stream": 520.0})
    assert len(policy.calls) == 2  # one kind left: no choice to make
    assert driver.running_by_kind() == {"batch": 1, "stream": 2}
    status = driver.status()
    assert status["running_by_kind"] == {"batch": 1, "stream": 2}
    assert status["serving_rows"] == {"batch": 300.0, "stream": 20.0}


def test_a_policy_naming_a_kind_without_tasks_is_an_error(clock, task_factory):
    driver = DataDriver(clock=clock, loading_policy=lambda c, r, b: "nonsense")
    driver.add_tasks([task_factory(0), stream_task(task_factory(1))])
    with pytest.raises(ValueError, match=r"loading policy picked kind 'nonsense'.*\['batch', 'stream'\]"):
        driver.lease("e")


def test_serving_rows_sum_live_executors_and_arrived_stream_rows(clock, task_factory):
    driver = DataDriver(clock=clock, lease_s=10.0)
    driver.add_tasks([task_factory(0), stream_task(task_factory(1), rows=700), stream_task(task_factory(2), rows=300)])
    assert driver.serving_rows_by_kind() == {"stream": 1000.0}  # a batch file waiting is no buffered data
    driver.heartbeat(ExecutorReport("a", "", metrics={"buffered_rows.batch": 100.0, "cpu": 0.5}))
    clock.advance(6)
    driver.heartbeat(ExecutorReport("b", "", metrics={"buffered_rows.batch": 50.0, "buffered_rows.stream": 10.0}))
    assert driver.buffered_rows_by_kind() == {"batch": 150.0, "stream": 10.0}
    clock.advance(5)  # a's last report is older than the lease: it no longer counts
    assert driver.buffered_rows_by_kind() == {"batch": 50.0, "stream": 10.0}
    leases = driver.lease("b", max_tasks=2)  # the batch file, then the 700-row stream task
    assert [lease.task.kind for lease in leases] == ["batch", "stream"]
    assert driver.serving_rows_by_kind() == {"batch": 50.0, "stream": 310.0}
    driver.fail("b", leases[1].task.task_id, "broker gone")  # back to pending: its rows wait again
    assert driver.serving_rows_by_kind()["stream"] == 1010.0
    restored = DataDriver.restore(driver.snapshot(), clock=clock)
    assert restored.serving_rows_by_kind() == {"stream": 1000.0}  # no executor reported to it yet

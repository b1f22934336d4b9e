"""``data.deterministic``: the reader releases the batches in the plan's order, whoever reads them when.

Two data executors serve one reader over Flight; one is slowed (``slow_ms_per_batch``) and every task is
small (3 batches), so tasks finish out of order and the executors' streams interleave. The delivered
``(task_id, first_row)`` sequence must be the plan's order -- task by task as the driver was given them,
each task's batches by ``first_row`` --, the same in a second run, across a restore from a barrier
snapshot, and with both kinds mixed by the seeded deterministic mixture. The driver never leases more than
``order_window`` tasks ahead of the reader.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pytest

from primus_dagster.data.batch import Batch
from primus_dagster.data.driver import DataDriver, DriverClient, DriverServer
from primus_dagster.data.executor import DataExecutor
from primus_dagster.data.reader import RemoteReader
from primus_dagster.data.tasks import DataTask
from primus_dagster.spec import JobSpec
from primus_dagster.training.priority import MixturePriority
from tests.data.executor.datakit import job_spec, plan, write_tree

Key = tuple[str, str, int]  # (kind, task_id, first_row)


def _world(tmp_path: Path, stream: bool = False) -> tuple[JobSpec, list[DataTask], list[int]]:
    ids = write_tree(tmp_path, rel="pq", hours=3, files=4, rows=60)
    if stream:
        ids += write_tree(tmp_path, rel="live", hours=3, files=2, rows=60, first_id=50_000)
    job = job_spec(batch_rows=25, task_runners=2, buffer_batches=2, stream_source=stream)
    return job, plan(job, tmp_path, hours=3), ids


def _run(
    job: JobSpec,
    tmp_path: Path,
    driver: DataDriver,
    *,
    slow: tuple[float, float] = (15.0, 0.0),
    stop_after: int | None = None,
    chooser: MixturePriority | None = None,
) -> tuple[list[Batch], dict | None]:
    """Two executors (one slowed) and a deterministic reader; the batches in the order released (the
    first ``stop_after``, then a barrier: its snapshot)."""
    executors = [
        DataExecutor(driver, job, f"data-{i}", str(tmp_path), heartbeat_s=0.05, slow_ms_per_batch=slow[i])
        for i in range(2)
    ]
    batches: list[Batch] = []
    snapshot = None
    for executor in executors:
        executor.start()
    try:
        locations = [e.location for e in executors]
        with RemoteReader(driver, 0, locations, deterministic=True, choose_queue=chooser, order_timeout_s=60) as reader:
            for batch in reader:
                batches.append(batch)
                if stop_after is not None and len(batches) == stop_after:
                    snapshot = reader.barrier(1)
                    break
    finally:
        for executor in executors:
            executor.close()
    return batches, snapshot


def _keys(batches: list[Batch]) -> list[Key]:
    return [(b.kind, b.meta.task_id, b.meta.first_row) for b in batches]


def _plan_order(tasks: list[DataTask], keys: list[Key]) -> list[Key]:
    """``keys`` sorted into the plan's order of their kind: task by task as planned, then ``first_row``."""
    place = {t.task_id: i for i, t in enumerate(tasks)}
    return sorted(keys, key=lambda k: (k[0], place[k[1]], k[2]))


def _ids(batches: list[Batch]) -> list[int]:
    """The sample ids of ``batches``, sorted."""
    out: list[int] = []
    for batch in batches:
        assert batch.sample_id is not None
        out += batch.sample_id.tolist()
    return sorted(out)


def _of_kind(keys: list[Key], kind: str) -> list[Key]:
    return [k for k in keys if k[0] == kind]


def test_two_executors_deliver_the_plan_order_twice(tmp_path: Path) -> None:
    job, tasks, ids = _world(tmp_path)
    runs = []
    for slow in ((15.0, 0.0), (0.0, 15.0)):  # the other executor slowed: different timing, same order
        driver = DataDriver.for_job(job.data.model_copy(update={"deterministic": True}))
        driver.add_tasks(tasks)
        batches, _ = _run(job, tmp_path, driver, slow=slow)
        keys = _keys(batches)
        assert keys == _plan_order(tasks, keys)
        assert len({k[1] for k in keys}) == len(tasks) == 12 and len(keys) == 36  # 3 batches a task
        assert _ids(batches) == ids
        runs.append(keys)
    assert runs[0] == runs[1]


def test_executors_in_the_readers_process_and_a_remote_driver_keep_the_order(tmp_path: Path) -> None:
    """The same order when the reader takes its batches from executors in its process (``feeds``) and
    asks the driver over Flight (a trainer on another host: ``task_order`` and claims as RPCs)."""
    job, tasks, ids = _world(tmp_path)
    driver = DataDriver.for_job(job.data.model_copy(update={"deterministic": True}))
    driver.add_tasks(tasks)
    executors = [DataExecutor(driver, job, f"data-{i}", str(tmp_path), serve=False) for i in range(2)]
    with DriverServer(driver) as server, DriverClient(server.location) as client:
        feeds = {e.location: e for e in executors}
        with RemoteReader(client, 0, list(feeds), feeds=feeds, deterministic=True) as reader:
            for executor in executors:
                executor.start()
            batches = list(reader)
        for executor in executors:
            executor.close()
    keys = _keys(batches)
    assert keys == _plan_order(tasks, keys) and len(keys) == 36
    assert _ids(batches) == ids


def test_without_the_setting_arrival_order_differs_from_the_plan(tmp_path: Path) -> None:
    """The control: the same two executors without ``deterministic`` deliver as the batches arrive."""
    job, tasks, _ = _world(tmp_path)
    driver = DataDriver.for_job(job.data)
    driver.add_tasks(tasks)
    executors = [
        DataExecutor(driver, job, f"data-{i}", str(tmp_path), heartbeat_s=0.05, slow_ms_per_batch=(15.0, 0.0)[i])
        for i in range(2)
    ]
    for executor in executors:
        executor.start()
    try:
        with RemoteReader(driver, 0, [e.location for e in executors]) as reader:
            keys = _keys(list(reader))
    finally:
        for executor in executors:
            executor.close()
    assert sorted(keys) == sorted(_plan_order(tasks, keys)) and keys != _plan_order(tasks, keys)


def test_mixed_kinds_follow_the_seeded_draws_and_each_kinds_plan_order(tmp_path: Path) -> None:
    job, tasks, ids = _world(tmp_path, stream=True)
    runs = []
    for slow in ((15.0, 0.0), (0.0, 15.0)):
        driver = DataDriver.for_job(job.data.model_copy(update={"deterministic": True}))
        driver.add_tasks(tasks)
        chooser = MixturePriority({"batch": 1.0, "stream": 1.0}, seed=7, deterministic=True)
        batches, _ = _run(job, tmp_path, driver, slow=slow, chooser=chooser)
        keys = _keys(batches)
        for kind in ("batch", "stream"):
            assert _of_kind(keys, kind) == _plan_order(tasks, _of_kind(keys, kind))
        assert _ids(batches) == sorted(ids)
        runs.append(keys)
    assert runs[0] == runs[1]
    kinds = [k[0] for k in runs[0]]
    assert sum(a != b for a, b in itertools.pairwise(kinds)) > 4  # the kinds interleave, drawn from the seed


def test_a_restored_run_goes_on_in_the_same_order(tmp_path: Path) -> None:
    job, tasks, _ = _world(tmp_path)
    data = job.data.model_copy(update={"deterministic": True})
    whole = DataDriver.for_job(data)
    whole.add_tasks(tasks)
    reference = _keys(_run(job, tmp_path, whole)[0])

    first = DataDriver.for_job(data)
    first.add_tasks(tasks)
    before, snapshot = _run(job, tmp_path, first, stop_after=14)
    assert snapshot is not None and snapshot["config"]["deterministic"] is True
    after, _ = _run(job, tmp_path, DataDriver.restore(snapshot), slow=(0.0, 15.0))
    assert _keys(before) + _keys(after) == reference


def test_the_driver_leases_only_within_the_window_of_the_reader() -> None:
    from tests.data.driver.conftest import make_task

    driver = DataDriver(lease_s=30, deterministic=True, order_window=2)
    tasks = [make_task(i) for i in range(5)]
    driver.add_tasks(tasks)
    reply = driver.task_order("trainer-0", "batch", 0, 10)
    assert reply["total"] == 5 and reply["window"] == 2 and [t[0] for t in reply["tasks"]] == [t.task_id for t in tasks]
    assert [lease.task.task_id for lease in driver.lease("e", 5)] == [tasks[0].task_id, tasks[1].task_id]
    assert driver.lease("e", 5) == []  # the reader is still at place 0
    driver.complete("e", tasks[0].task_id, rows=0, batches=0)  # an empty task: sealed at once
    assert driver.task_order("trainer-0", "batch", 1, 10)["tasks"][0] == [tasks[1].task_id, False, False]
    assert [lease.task.task_id for lease in driver.lease("e", 5)] == [tasks[2].task_id]
    assert driver.task_order("trainer-0", "batch", 0, 1)["tasks"] == [[tasks[0].task_id, True, False]]


def test_a_batch_that_never_comes_times_out_naming_the_task(tmp_path: Path) -> None:
    job, tasks, _ = _world(tmp_path)
    driver = DataDriver.for_job(job.data.model_copy(update={"deterministic": True}))
    driver.add_tasks(tasks)  # no executor reads them
    with RemoteReader(driver, 0, [], deterministic=True, order_timeout_s=0.5) as reader:
        with pytest.raises(TimeoutError, match=f"deterministic order.*{tasks[0].task_id}"):
            reader.next_batch()
        with pytest.raises(TimeoutError, match=r"within 0\.1s"):
            reader.next_batch(timeout=0.1)


def test_the_reorder_buffer_stays_within_the_window(tmp_path: Path) -> None:
    """A slow consumer: what the reader holds never spans more tasks than the driver's window (the
    reader reports its place before the executors start, as a trainer's does before the first batch)."""
    job, tasks, _ = _world(tmp_path)
    driver = DataDriver.for_job(job.data.model_copy(update={"deterministic": True}))
    driver.order_window = 3
    driver.add_tasks(tasks)
    executors = [DataExecutor(driver, job, f"data-{i}", str(tmp_path), heartbeat_s=0.05) for i in range(2)]
    spans: list[int] = []
    try:
        with RemoteReader(driver, 0, [e.location for e in executors], deterministic=True) as reader:
            for executor in executors:
                executor.start()
            for _batch in reader:
                spans.append(reader.order_status()["batch"]["held_tasks"])
                threading.Event().wait(0.01)
    finally:
        for executor in executors:
            executor.close()
    assert len(spans) == 36 and max(spans) <= 3


def test_the_deterministic_mixture_draws_from_the_seed_and_weights_alone() -> None:
    from primus_dagster.data.reader import QueueStat

    def stats(batch: int, stream: int) -> dict[str, QueueStat]:
        return {
            "batch": QueueStat("batch", batch, 4, 0, 0.0, batch * 100),
            "stream": QueueStat("stream", stream, 4, 0, 9.0),
        }

    calls: list[int] = []

    def backlog() -> dict[str, float]:
        calls.append(1)
        return {"batch": 1e6}

    a = MixturePriority({"batch": 1.0, "stream": 3.0}, seed=3, deterministic=True, backlog_fn=backlog)
    b = MixturePriority({"batch": 1.0, "stream": 3.0}, seed=3, deterministic=True)
    assert a.probabilities(stats(0, 5)) == {"batch": 0.25, "stream": 0.75}
    picks_a = [a(stats(i % 3, 4 - i % 4)) for i in range(200)]  # queue fills that change: no effect
    picks_b = [b(stats(1, 1)) for _ in range(200)]
    assert picks_a == picks_b and calls == [] and 0.65 < picks_a.count("stream") / 200 < 0.85
    resumed = MixturePriority({"batch": 1.0, "stream": 3.0}, seed=3, deterministic=True)
    resumed.skip(150)
    assert [resumed(stats(1, 1)) for _ in range(50)] == picks_b[150:]

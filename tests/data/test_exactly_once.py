"""Exactly-once delivery end to end: Parquet + Kafka, real executor processes, Flight, the driver.

Two faults, injected for real: an executor is SIGKILLed in the middle of serving, and (separately)
the whole data plane is torn down after a checkpoint barrier and restored from the driver's
snapshot. In both, the multiset of (stream, sample id) delivered equals the expected one. Executor
processes run in a local pool (``tests.data.planekit``); executors as threads of this process in the
in-trainer plane.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from primus_dagster.cluster.pooled_plane import PooledDataPlane
from primus_dagster.data import InTrainerDataPlane
from primus_dagster.data.driver import DataDriver
from primus_dagster.data.graph import Planner
from primus_dagster.data.sources import SourceContext, TimeWindow, make_adapter
from primus_dagster.spec import load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from tests.data.planekit import kill_mid_serving, local_plane

pytestmark = pytest.mark.integration

JOB = """
name: exactly-once
data: {lease: 2s, max_attempts: 5, buffer_batches: 4}
pools: {data: {replicas: 2, task_runners: 2}, training: {replicas: 1}}
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 2h
      shuffle: forward
      sources:
        - name: imp
          type: parquet
          kind: batch
          batch_rows: 200
          path: parquet/impressions
          columns: &cols {ts: event_time, label: click, id: sample_id, dense: [d0, d1, d2], sparse: [user_id, item_id]}
    - name: live
      window: 2h
      shuffle: rebalance
      sources:
        - name: events
          type: kafka
          kind: stream
          batch_rows: 200
          topic: exactly-once-events
          max_records_per_task: 700
          columns: *cols
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, kafka_broker) -> dict:
    root = tmp_path_factory.mktemp("exactly_once")
    job_path = root / "job.yaml"
    job_path.write_text(JOB)
    job = load_job_spec(job_path)
    context = SourceContext(str(root), kafka_broker.bootstrap_servers)
    world = SyntheticWorld(WorldConfig(seed=3, rows_per_hour=1500, n_dense=3), job.dataset.start)
    # Hour 2 too, so the stream has moved past hours 0-1 (their Kafka partitions are ready).
    write_world(job, context, world, range(3), files_per_hour=3, progress=False)
    window = TimeWindow(job.dataset.start, job.dataset.start + timedelta(hours=2))
    tasks = list(Planner(job.dataset, context, threads=2).plan(window).tasks)
    expected: Counter = Counter()
    for task in tasks:  # independently of the data plane: read every task through its adapter
        with make_adapter(job.dataset.source(task.read.source), context) as adapter:
            for batch in adapter.read(task.read):
                expected.update((task.stream, i) for i in batch.column("sample_id").to_pylist())
    assert {s for s, _ in expected} == {"history", "live"}
    return {
        "root": root,
        "job_path": job_path,
        "tasks": tasks,
        "expected": expected,
        "bootstrap": kafka_broker.bootstrap_servers,
    }


def plane(world: dict, in_process: bool = False, **kwargs) -> PooledDataPlane | InTrainerDataPlane:
    """The world's plane: executor processes in a local pool, or (``in_process``) threads of this process."""
    make = InTrainerDataPlane if in_process else local_plane
    return make(world["job_path"], world["root"], kafka_bootstrap=world["bootstrap"], heartbeat_s=0.2, **kwargs)


def delivered(batch) -> list[tuple[str, int]]:
    return [(batch.stream, int(i)) for i in batch.sample_id.tolist()]


def test_sigkill_of_an_executor_mid_serving_loses_and_repeats_nothing(world: dict) -> None:
    got: list[tuple[str, int]] = []
    with plane(world, tasks=world["tasks"], executors=2, slow_ms_per_batch={0: 30}) as dp:
        running = kill_mid_serving(dp, lambda batch: got.extend(delivered(batch)), claims=15)
        status = dp.driver.status()
    assert running > 0
    assert status["done"] and not status["failed"]
    assert Counter(got) == world["expected"]
    assert len(got) == sum(world["expected"].values())


@pytest.mark.parametrize("in_process", [False, True], ids=["executor-processes", "executors-in-process"])
def test_restore_from_a_barrier_snapshot_replays_exactly_the_unseen_batches(
    world: dict, tmp_path: Path, in_process: bool
) -> None:
    """The crashed run's executors are processes or threads of the trainer's process (the restored
    run's are processes): the snapshot means the same either way."""
    before: list[tuple[str, int]] = []
    lost: list[tuple[str, int]] = []
    snapshot_path = tmp_path / "driver.json"
    first = plane(world, in_process, tasks=world["tasks"], executors=1)
    with first as dp, dp.reader(0, refresh_s=0.1) as reader:
        for _ in range(12):
            before.extend(delivered(reader.next_batch(timeout=30)))
        snapshot = reader.barrier(1, wait_s=10)
        assert snapshot is not None and snapshot["barrier_id"] == 1
        DataDriver.restore(snapshot).save(snapshot_path)
        for _ in range(6):  # trained after the checkpoint, then the job crashes: discarded
            lost.extend(delivered(reader.next_batch(timeout=30)))
    # Crash: readers, executors and the driver are gone. Restart from the snapshot.
    after: list[tuple[str, int]] = []
    restored = DataDriver.load(snapshot_path)
    with plane(world, driver=restored, executors=2) as dp:
        with dp.reader(0, refresh_s=0.1) as reader:
            for batch in reader:
                after.extend(delivered(batch))
        assert dp.driver.status()["done"]
    assert lost, "the crashed run should have consumed batches after the barrier"
    assert len(after) == len(set(after)), "a sample was delivered twice after the restore"
    assert Counter(before) + Counter(after) == world["expected"]
    assert not (set(before) & set(after))


def test_executors_in_process_serve_two_trainers_every_sample_once(world: dict) -> None:
    """Executors as threads of this process (no executor process, no Flight stream): two trainers'
    readers together get every sample of both kinds exactly once, and the driver ends done."""
    got: list[list[tuple[str, int]]] = [[], []]
    with plane(world, True, tasks=world["tasks"], executors=2, trainers=2) as dp:
        assert isinstance(dp, InTrainerDataPlane)
        assert sorted(dp.data_executors) == ["inproc://data-0", "inproc://data-1"]
        readers = [dp.reader(t, refresh_s=0.1) for t in (0, 1)]

        def consume(trainer: int) -> None:
            for batch in readers[trainer]:
                got[trainer].extend(delivered(batch))

        threads = [threading.Thread(target=consume, args=(t,), daemon=True) for t in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive(), "a reader did not end"
        for reader in readers:
            reader.close()
        assert dp.wait_executors(10) == [0, 0]
        status = dp.driver.status()
    assert status["done"] and not status["failed"]
    assert got[0] and got[1], "both trainers should have been served"
    assert Counter(got[0] + got[1]) == world["expected"]

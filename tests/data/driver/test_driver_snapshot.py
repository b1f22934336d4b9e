"""Driver snapshots: JSON file round trip, restore semantics, and an exactly-once crash simulation."""

from __future__ import annotations

import json
import random
from collections import Counter, deque

import pytest

from primus_dagster.data.driver import DataDriver, ExecutorReport
from primus_dagster.data.tasks import BatchId


def test_snapshot_json_round_trip_through_file(tmp_path, clock, task_factory):
    driver = DataDriver(max_attempts=2, lease_s=7, trainers=1, clock=clock)
    tasks = [task_factory(i, note=f"n{i}") for i in range(4)]
    driver.add_tasks(tasks)
    driver.source_versions = {"history": {"delta_version": 12}, "clicks": {"kafka": {"0": 42, "1": 17}}}
    a, b = driver.lease("e", max_tasks=2)
    driver.fail("e", b.task.task_id, "flaky")
    driver.barrier("t0", [BatchId(a.task.task_id, 0, 5)], barrier_id=3)
    path = driver.save(tmp_path / "ckpt" / "driver.json")
    assert sorted(p.name for p in path.parent.iterdir()) == ["driver.json"]  # no temp file left
    snap = json.loads(path.read_text())
    assert snap == json.loads(json.dumps(driver.snapshot()))
    assert snap["barrier_id"] == 3 and snap["source_versions"]["clicks"]["kafka"]["0"] == 42
    assert snap["config"] == {
        "max_attempts": 2,
        "failed_task_threshold": 0.05,
        "lease_s": 7.0,
        "trainers": 1,
        "backup_after": 0.0,
    }
    restored = DataDriver.load(path, clock=clock)
    assert restored.source_versions == driver.source_versions and restored.max_attempts == 2
    for task in tasks:
        before, after = driver.task_info(task.task_id), restored.task_info(task.task_id)
        for key in ("attempts", "failures", "error", "consumed", "rows", "batches"):
            assert before[key] == after[key], key
    assert restored.task_info(a.task.task_id)["state"] == "pending"  # was running
    assert restored.task_info(b.task.task_id)["error"].startswith("flaky")
    assert [t.task for t in restored.lease("x", max_tasks=4)] == sorted(tasks, key=lambda t: t.order_key)
    assert restored.barrier("t0", [], barrier_id=3)["barrier_id"] == 3  # a trainer re-polling its barrier
    with pytest.raises(ValueError, match="not a data driver snapshot"):
        DataDriver.restore({"tasks": []})


def test_restore_forgets_claims_after_barrier_and_reserves_unconsumed(clock, task_factory):
    driver = DataDriver(max_attempts=1, failed_task_threshold=1.0, clock=clock)
    done, partial, running, failed, fresh = (task_factory(i) for i in range(5))
    driver.add_tasks([done, partial, running, failed, fresh])
    leases = {lease.task.task_id: lease for lease in driver.lease("e", max_tasks=4)}
    assert fresh.task_id not in leases

    def batch(task, row):
        return BatchId(task.task_id, row, 10)

    for task in (done, partial):
        for row in (0, 10, 20):
            assert driver.claim("t0", batch(task, row))
        driver.complete("e", task.task_id, rows=30, batches=3)
    assert driver.claim("t0", batch(running, 0))
    driver.fail("e", failed.task_id, "bad file")
    consumed = [batch(done, r) for r in (0, 10, 20)] + [batch(partial, 0), batch(running, 0)]
    snap = driver.barrier("t0", consumed, barrier_id=1)
    # after the barrier: more claims, then the crash
    assert driver.claim("t0", batch(running, 10)) and not driver.claim("t0", batch(partial, 10))

    restored = DataDriver.restore(json.loads(json.dumps(snap)), clock=clock)
    state = {t.task_id: restored.task_info(t.task_id)["state"] for t in (done, partial, running, failed, fresh)}
    assert state == {
        done.task_id: "succeeded",
        partial.task_id: "pending",
        running.task_id: "pending",
        failed.task_id: "failed",
        fresh.task_id: "pending",
    }
    assert restored.task_info(running.task_id)["attempts"] == 1
    leases = {lease.task.task_id: lease for lease in restored.lease("e2", max_tasks=10)}
    assert set(leases) == {partial.task_id, running.task_id, fresh.task_id}
    assert leases[partial.task_id].claimed_rows == (0,) and leases[running.task_id].claimed_rows == (0,)
    assert leases[running.task_id].attempt == 2
    assert not restored.claim("t0", batch(partial, 0))  # consumed at the barrier: refused
    assert restored.claim("t0", batch(partial, 10))  # claimed after the barrier only: served again
    assert not restored.claim("t0", batch(done, 20))
    status = restored.status()
    assert status["barrier_id"] == 1 and status["consumed_done"] == 1 and status["counts"]["failed"] == 1


def _simulate(seed: int, tasks_n: int, tmp_path, task_factory) -> None:
    """Executors serve (with deaths, failures and duplicate sends), two trainers claim and consume,
    barrier, keep going, crash, restore from the barrier file and finish: every batch exactly once."""
    rng = random.Random(seed)
    clock = [0.0]
    tasks = [task_factory(i, hour=rng.randrange(48)) for i in range(tasks_n)]
    layout: dict[str, list[BatchId]] = {}
    for task in tasks:
        sizes = [rng.randint(1, 50) for _ in range(rng.randint(0, 6))]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        layout[task.task_id] = [BatchId(task.task_id, s, n) for s, n in zip(starts, sizes, strict=True)]
    every = Counter(b for bs in layout.values() for b in bs)
    trainers = ["t0", "t1"]

    def run(driver: DataDriver, until: float | None) -> tuple[list[BatchId], dict[str, list[BatchId]]]:
        """Drive until ``until`` of all batches are consumed (None: to the end); returns the consumed
        batches in order and, per trainer, those consumed since its last barrier."""
        queues: dict[str, deque[BatchId]] = {t: deque() for t in trainers}
        since: dict[str, list[BatchId]] = {t: [] for t in trainers}
        consumed: list[BatchId] = []
        active: dict[str, tuple[str, deque[BatchId]]] = {}  # executor -> (task, batches left to send)
        executors = [f"exec-{i}" for i in range(4)]
        for _ in range(100_000):
            finished = driver.status()["done"] and not active and not any(queues.values())
            if finished or (until is not None and len(consumed) >= until * sum(every.values())):
                return consumed, since
            clock[0] += 1.0
            for ex in executors:
                if ex not in active:
                    for lease in driver.lease(ex):
                        skip = set(lease.claimed_rows)
                        todo = deque(
                            b for b in layout[lease.task.task_id] if b.first_row not in skip or rng.random() < 0.1
                        )
                        active[ex] = (lease.task.task_id, todo)
                    continue
                task_id, todo = active[ex]
                roll = rng.random()
                if roll < 0.03:  # the executor dies: its lease expires later
                    del active[ex]
                    continue
                if roll < 0.05:
                    driver.fail(ex, task_id, "transient read error")
                    del active[ex]
                    continue
                if driver.heartbeat(ExecutorReport(ex, f"grpc://{ex}", running=[task_id]))["cancel"]:
                    del active[ex]  # lost the lease (it was re-leased): stop
                    continue
                if todo:
                    batch = todo.popleft()
                    if rng.random() < 0.05:
                        todo.appendleft(batch)  # sent twice
                    trainer = rng.choice(trainers)
                    if driver.claim(trainer, batch):
                        queues[trainer].append(batch)
                else:
                    bs = layout[task_id]
                    driver.complete(ex, task_id, rows=sum(b.rows for b in bs), batches=len(bs))
                    del active[ex]
            for t in trainers:
                for _ in range(rng.randint(0, 2)):
                    if queues[t]:
                        batch = queues[t].popleft()
                        consumed.append(batch)
                        since[t].append(batch)
        raise AssertionError("the simulation did not finish")

    path = tmp_path / f"driver-{seed}.json"
    driver = DataDriver(max_attempts=1000, lease_s=5.0, trainers=2, clock=lambda: clock[0], pending_window=3)
    driver.add_tasks(tasks)
    before, since = run(driver, until=0.4)
    assert driver.barrier("t0", since["t0"], barrier_id=1) is None
    snap = driver.barrier("t1", since["t1"], barrier_id=1)
    assert snap is not None
    driver.save(path, snap)
    states = Counter(e["state"] for e in snap["tasks"])
    half_consumed = [e for e in snap["tasks"] if e["state"] == "succeeded" and len(e["consumed"]) < e["batches"]]
    assert states["running"] and states["succeeded"] and half_consumed  # the interesting cases occur
    at_barrier = Counter(before)
    assert max(at_barrier.values()) == 1
    lost_run, _ = run(driver, until=0.2)  # consumed after the barrier, then the crash: discarded
    assert lost_run

    restored = DataDriver.load(path, clock=lambda: clock[0])
    assert restored.status()["counts"]["succeeded"] < states["succeeded"]
    after, since = run(restored, until=None)
    assert Counter(after) == every - at_barrier  # nothing lost, nothing twice
    assert not set(after) & set(at_barrier)
    assert restored.barrier("t0", since["t0"], barrier_id=2) is None
    snap = restored.barrier("t1", since["t1"], barrier_id=2)
    assert all(entry["state"] == "succeeded" for entry in snap["tasks"])
    assert restored.status()["consumed_done"] == tasks_n


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_exactly_once_across_crash_and_restore(seed, tmp_path, task_factory):
    _simulate(seed, tasks_n=150, tmp_path=tmp_path, task_factory=task_factory)

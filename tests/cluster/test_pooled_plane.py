"""PooledDataPlane: real executor processes in a local pool, supervised; exactly-once across a
SIGKILL and its restart; an executor out of restarts aborts the job; nothing outlives the plane."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from primus_dagster.cluster.pooled_plane import PooledDataPlane
from primus_dagster.data import JobAbortedError
from primus_dagster.spec import parse_job_spec
from tests.data.executor.datakit import job_text, plan, write_tree

pytestmark = pytest.mark.integration


def job_file(tmp_path: Path, restart: str, max_restarts: int = 2, replicas: int = 2) -> Path:
    spec = tmp_path / "job.yaml"
    pool = f"max_replicas: 4, restart: {restart}, max_restarts: {max_restarts}, memory: 1Gi"
    spec.write_text(
        job_text(batch_rows=50, buffer_batches=2, task_runners=1, lease="3s", replicas=replicas, data_pool=pool)
    )
    return spec


def executor_pids(plane: PooledDataPlane) -> list[int]:
    return [int(s.labels["pid"]) for s in plane.pool.status()]


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def test_a_killed_executor_is_restarted_and_every_row_arrives_once(tmp_path: Path) -> None:
    ids = write_tree(tmp_path, hours=2, files=4, rows=400)
    spec = job_file(tmp_path, restart="on_failure")
    tasks = plan(parse_job_spec(spec.read_text()), tmp_path, hours=2)
    got: Counter[int] = Counter()
    with PooledDataPlane(spec, tmp_path, tasks, token="t0k3n", heartbeat_s=0.2) as plane:
        pids = executor_pids(plane)
        assert len(pids) == 2 and all(alive(p) for p in pids)
        with plane.reader(0, prefetch=2, refresh_s=0.1) as reader:
            for i, batch in enumerate(reader):
                assert batch.sample_id is not None
                got.update(batch.sample_id.tolist())
                if i == 3:
                    os.kill(pids[0], signal.SIGKILL)  # a dead node, mid-serving
                time.sleep(0.01)
        plane.raise_if_failed()
        summary = plane.summary()
        all_pids = executor_pids(plane)
    assert got == Counter(ids)  # nothing lost, nothing twice
    assert summary["restarts"] >= 1 and summary["error"] is None
    assert not any(alive(p) for p in [*pids, *all_pids])


def test_an_executor_out_of_restarts_aborts_the_job_with_its_error(tmp_path: Path) -> None:
    write_tree(tmp_path, hours=2, files=4, rows=400)
    spec = job_file(tmp_path, restart="never", replicas=1)
    tasks = plan(parse_job_spec(spec.read_text()), tmp_path, hours=2)
    with PooledDataPlane(spec, tmp_path, tasks, heartbeat_s=0.2) as plane:
        (pid,) = executor_pids(plane)
        with plane.reader(0, prefetch=2, refresh_s=0.1) as reader:
            for i, _ in enumerate(reader):
                if i == 1:
                    os.kill(pid, signal.SIGKILL)
        with pytest.raises(JobAbortedError, match=r"restart policy never: data-0 exited with code -9"):
            plane.raise_if_failed()
        assert "restart policy never" in (plane.summary()["error"] or "")
    assert not alive(pid)


def test_the_data_pool_scales_out_under_load_and_in_when_idle_and_delivers_once(tmp_path: Path) -> None:
    """Live: while the trainer consumes fast the executors' CPU load crosses the (low) scale-up
    threshold and the pool grows to max_replicas; while the trainer pauses the executors sit on full
    buffers, the load falls below the scale-down threshold and the pool shrinks to min_replicas."""
    from primus_dagster.cluster.autoscaler import DataPoolAutoscaler

    ids = write_tree(tmp_path, hours=2, files=8, rows=3000)
    spec = tmp_path / "job.yaml"
    scaling = """scaling:
  interval: 0.3s
  cooldown: 0.6s
  horizontal: {metrics: [{name: cpu, weight: 1}], scale_up_threshold: 0.15, scale_down_threshold: 0.05, step: 1}
  vertical: {enabled: false}"""
    pool = "min_replicas: 1, max_replicas: 3, memory: 1Gi"
    spec.write_text(
        job_text(batch_rows=100, buffer_batches=2, task_runners=1, lease="3s", data_pool=pool, top_level=scaling)
    )
    job = parse_job_spec(spec.read_text())
    tasks = plan(job, tmp_path, hours=2)
    scaler = DataPoolAutoscaler(job)
    got: Counter[int] = Counter()
    replicas_seen: list[int] = []
    with PooledDataPlane(spec, tmp_path, tasks, token="t", heartbeat_s=0.1, controller=scaler, check_s=0.1) as plane:
        with plane.reader(0, prefetch=2, refresh_s=0.1) as reader:
            for i, batch in enumerate(reader):
                assert batch.sample_id is not None
                got.update(batch.sample_id.tolist())
                running = sum(not s.finished for s in plane.pool.status())
                replicas_seen.append(running)
                if i == 150:  # the trainer stalls: executors idle on full buffers
                    deadline = time.monotonic() + 20
                    while scaler.controller.actions["scale_in"] == 0 and time.monotonic() < deadline:
                        time.sleep(0.1)
        plane.raise_if_failed()
    assert got == Counter(ids)  # scale-out and scale-in lost and repeated nothing
    assert scaler.controller.actions["scale_out"] >= 1 and scaler.controller.actions["scale_in"] >= 1
    assert max(replicas_seen) <= 3 and min(replicas_seen) >= 1

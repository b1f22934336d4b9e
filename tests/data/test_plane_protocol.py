"""Both data planes are a ``DataPlane``: the members every caller uses are there without probing --
``started_at`` once started, a ``summary()`` with the common keys, ``raise_if_failed``, ``cpu_seconds``,
``readers()`` -- for an :class:`InTrainerDataPlane` (executors in this process) and a
:class:`PooledDataPlane` on the local pool (executor processes), each reading a tiny Parquet job to
the end."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from primus_dagster.cluster.backends import data_plane_starter
from primus_dagster.cluster.pooled_plane import PooledDataPlane
from primus_dagster.data import DataDriver, DataPlane, InTrainerDataPlane
from primus_dagster.spec import parse_job_spec
from tests.data.executor.datakit import job_text, plan, write_tree

pytestmark = pytest.mark.integration

COMMON_KEYS = {
    "scaling",
    "timeline",
    "data_executors_launched",
    "data_executors_running",
    "restarts",
    "oom_restarts",
    "blacklisted_nodes",
    "error",
    "cpu_seconds",
}


def tiny_job(tmp_path: Path) -> tuple[Path, list[Any], list[int]]:
    ids = write_tree(tmp_path, hours=1, files=2, rows=60)
    spec = tmp_path / "job.yaml"
    spec.write_text(job_text(batch_rows=30, task_runners=1, lease="3s", data_pool="memory: 1Gi"))
    return spec, plan(parse_job_spec(spec.read_text()), tmp_path, hours=1), ids


def read_all(plane: DataPlane) -> Counter[int]:
    got: Counter[int] = Counter()
    with plane.reader(0, prefetch=2, refresh_s=0.1) as reader:
        assert plane.readers() == {0: reader}  # the latest reader of each trainer
        for batch in reader:
            assert batch.sample_id is not None
            got.update(batch.sample_id.tolist())
    plane.raise_if_failed()
    return got


def check_started(plane: DataPlane, before: float) -> None:
    assert isinstance(plane, DataPlane)
    assert before <= plane.started_at <= time.monotonic()  # set when its executors were started
    assert plane.location.startswith("grpc://") and plane.trainers == 1 and plane.token == "t0k3n"
    assert isinstance(plane.driver, DataDriver) and plane.job.name == "exec-test"


def check_summary(summary: dict[str, Any], executors: int) -> None:
    assert summary.keys() >= COMMON_KEYS
    assert summary["data_executors_launched"] == executors and summary["restarts"] == 0
    assert summary["timeline"] == [] and summary["scaling"] is None and summary["error"] is None
    assert summary["cpu_seconds"] >= 0.0


def test_an_in_trainer_plane_is_a_data_plane(tmp_path: Path) -> None:
    spec, tasks, ids = tiny_job(tmp_path)
    plane = InTrainerDataPlane(spec, tmp_path, tasks, executors=1, token="t0k3n")
    assert isinstance(plane, DataPlane) and plane.readers() == {}  # before it is started too
    before = time.monotonic()
    with plane:
        check_started(plane, before)
        assert read_all(plane) == Counter(ids)
        summary = plane.summary()
        assert plane.cpu_seconds() == 0.0  # its executors' CPU is this process's
    check_summary(summary, executors=1)
    assert summary["executors_in_process"] is True


def test_a_pooled_plane_is_a_data_plane(tmp_path: Path) -> None:
    spec, tasks, ids = tiny_job(tmp_path)
    before = time.monotonic()
    plane = PooledDataPlane(spec, tmp_path, tasks, executors=1, token="t0k3n", heartbeat_s=0.2)
    assert isinstance(plane, DataPlane) and plane.readers() == {} and plane.cpu_seconds() == 0.0  # not started
    with plane:
        check_started(plane, before)
        assert read_all(plane) == Counter(ids)
        assert plane.wait_executors(30) == [0]  # it exited by itself once the data was done
        summary = plane.summary()
        with_startup, after_ready = plane.cpu_seconds(), plane.cpu_seconds(include_startup=False)
    check_summary(summary, executors=1)
    assert summary["cpu_seconds"] > 0.0  # a real process ran, measured
    assert with_startup > after_ready > 0.0  # its start-up (interpreter, imports) apart from its work


def test_the_starters_make_data_planes(tmp_path: Path) -> None:
    """``data_plane_starter`` (a DataPlaneStarter) starts a DataPlane for either backend."""
    spec, tasks, ids = tiny_job(tmp_path)
    job = parse_job_spec(spec.read_text())
    for backend in ("in_trainer", "local"):
        job = job.model_copy(update={"pools": job.pools.model_copy(update={"backend": backend})})
        start = data_plane_starter(job, run_id="r1")
        driver = DataDriver.for_job(job.data, trainers=1)
        driver.add_tasks(tasks)
        with start(
            spec, tmp_path, driver=driver, executors=1, trainers=1, token="t0k3n", kafka_bootstrap=None
        ) as plane:
            assert isinstance(plane, DataPlane) and plane.started_at <= time.monotonic()
            assert read_all(plane) == Counter(ids)
            assert plane.summary().keys() >= COMMON_KEYS

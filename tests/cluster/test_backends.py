"""``pools.backend`` -> the data plane a run starts: a pooled plane on the pool of ``local`` (and
``kubernetes``), executors in the trainer's process for ``in_trainer`` -- also through the Dagster
``ExecutorPoolResource`` -- and nothing for ``data_plane_setup`` to set up without a pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_dagster.cluster.backends import data_plane_setup, data_plane_starter
from primus_dagster.cluster.pooled_plane import PooledDataPlane
from primus_dagster.dagster_defs.resources import ExecutorPoolResource
from primus_dagster.data import InTrainerDataPlane
from primus_dagster.spec import parse_job_spec
from tests.speckit import one_source_spec


def write_job(tmp_path: Path, backend: str) -> Path:
    path = tmp_path / f"{backend}.yaml"
    path.write_text(
        one_source_spec("backends", f"pools: {{backend: {backend}, data: {{replicas: 2, task_runners: 1}}}}\n")
    )
    return path


def test_local_starts_a_pooled_plane_on_local_processes(tmp_path: Path) -> None:
    job = parse_job_spec(write_job(tmp_path, "local").read_text())
    start = data_plane_starter(job, run_id="r")
    assert start.func is PooledDataPlane  # type: ignore[attr-defined]
    assert start.keywords["driver_host"] == "127.0.0.1"  # type: ignore[attr-defined]


def test_in_trainer_starts_executors_in_this_process_and_sets_up_no_pool(tmp_path: Path) -> None:
    path = write_job(tmp_path, "in_trainer")
    job = parse_job_spec(path.read_text())
    with pytest.raises(ValueError, match="runs no executor pool"):
        data_plane_setup(job, run_id="r")
    with data_plane_starter(job, run_id="r")(path, tmp_path, executors=2, trainers=1) as plane:
        assert isinstance(plane, InTrainerDataPlane)
        assert sorted(plane.data_executors) == ["inproc://data-0", "inproc://data-1"]


def test_the_dagster_resource_starts_and_closes_the_in_trainer_plane(tmp_path: Path) -> None:
    path = write_job(tmp_path, "in_trainer")
    resource = ExecutorPoolResource()
    plane = resource.data_plane_factory(parse_job_spec(path.read_text()))(path, tmp_path, executors=1, trainers=1)
    with plane:
        assert isinstance(plane, InTrainerDataPlane) and list(plane.data_executors) == ["inproc://data-0"]
    resource.teardown_after_execution(None)  # type: ignore[arg-type]  # closes it again: idempotent

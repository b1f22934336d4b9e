"""primus_dagster/run_queue.py and the instance ``paths.dagster_home`` writes: a run queue sized to the machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, QueuedRunCoordinator

from primus_dagster import paths
from primus_dagster.run_queue import RUN_KIND_TAG, run_queue_config


@pytest.mark.parametrize("cores,runs", [(1, 2), (2, 2), (3, 2), (8, 4), (16, 8)])
def test_the_queue_runs_half_the_cores_at_once_and_one_heavy_run_of_each_kind(cores: int, runs: int) -> None:
    config = run_queue_config(cores)
    assert config["max_concurrent_runs"] == runs
    assert config["tag_concurrency_limits"] == [
        {"key": RUN_KIND_TAG, "value": "training", "limit": 1},
        {"key": RUN_KIND_TAG, "value": "live", "limit": 1},
    ]


def test_a_new_dagster_home_queues_runs_and_dagster_loads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    home = paths.dagster_home()
    written = yaml.safe_load((home / "dagster.yaml").read_text())
    assert written == {"telemetry": {"enabled": False}, "run_queue": run_queue_config()}
    instance = DagsterInstance.from_config(str(home))
    try:
        coordinator = instance.run_coordinator
        assert isinstance(coordinator, QueuedRunCoordinator)
        queue = coordinator.get_run_queue_config()
        assert queue.max_concurrent_runs == run_queue_config()["max_concurrent_runs"]
        assert queue.tag_concurrency_limits == run_queue_config()["tag_concurrency_limits"]
    finally:
        instance.dispose()


def test_an_older_default_file_is_upgraded_and_a_teams_own_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, own = tmp_path / "old", tmp_path / "own"
    old.mkdir()
    own.mkdir()
    (old / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # what earlier versions wrote
    team = "telemetry:\n  enabled: false\nrun_queue:\n  max_concurrent_runs: 1\n"
    (own / "dagster.yaml").write_text(team)
    monkeypatch.setenv("DAGSTER_HOME", str(old))
    assert "run_queue" in yaml.safe_load((paths.dagster_home() / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(own))
    assert (paths.dagster_home() / "dagster.yaml").read_text() == team

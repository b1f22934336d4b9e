"""primus_dagster/run_queue.py and the instance ``paths.dagster_home`` writes: a run queue sized to the machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, QueuedRunCoordinator

from primus_dagster import paths
from primus_dagster.run_queue import RUN_KIND_TAG, concurrency_config, run_queue_config


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
    assert written == {"telemetry": {"enabled": False}, "concurrency": concurrency_config()}
    assert written["concurrency"]["pools"] == {"granularity": "run", "default_limit": 1}
    instance = DagsterInstance.from_config(str(home))
    try:
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        concurrency = instance.get_concurrency_config()  # what the daemon's run queue reads
        queue = concurrency.run_queue_config
        assert queue is not None and queue.max_concurrent_runs == run_queue_config()["max_concurrent_runs"]
        assert queue.tag_concurrency_limits == run_queue_config()["tag_concurrency_limits"]
        # one run per pool (the training asset's, the live model's) at a time, however the run was launched
        pools = concurrency.pool_config
        assert pools.pool_granularity is not None and pools.pool_granularity.value == "run"
        assert pools.default_pool_limit == 1
    finally:
        instance.dispose()


def test_an_older_default_file_is_upgraded_and_a_teams_own_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, older, own = tmp_path / "old", tmp_path / "older", tmp_path / "own"
    for home in (old, older, own):
        home.mkdir()
    (older / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # what earlier versions wrote
    before_pools = {"telemetry": {"enabled": False}, "run_queue": run_queue_config()}  # and then, before pools
    header = "# Written by primus_dagster (paths.dagster_home): edit freely, it is not rewritten.\n"
    (old / "dagster.yaml").write_text(header + yaml.safe_dump(before_pools, sort_keys=False))
    team = "telemetry:\n  enabled: false\nrun_queue:\n  max_concurrent_runs: 1\n"
    (own / "dagster.yaml").write_text(team)
    for home in (older, old):
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        upgraded = yaml.safe_load((paths.dagster_home() / "dagster.yaml").read_text())
        assert upgraded == {"telemetry": {"enabled": False}, "concurrency": concurrency_config()}
    monkeypatch.setenv("DAGSTER_HOME", str(own))
    assert (paths.dagster_home() / "dagster.yaml").read_text() == team

"""Training partitions in order: the asset depends on its own previous partition; three consecutive
partitions materialised through one instance each continue the model of the one before; a partition
whose predecessor never trained fails naming it, or starts fresh (logged, in metadata) under
``automation.cold_start: allow``. A backfill through the daemon (``dagster dev``) runs two partitions one
after the other, the second continuing the first's model: tests/devtools/test_demo.py launches it from
the UI's Materialize dialog and checks that."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, TimeWindowPartitionMapping, instance_for_test, materialize

from primus_dagster.dagster_defs import (
    ExecutorPoolResource,
    MlflowResource,
    PrimusStorageResource,
    build_training_asset,
)
from primus_dagster.spec import load_job_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from jobkit import make_job

pytestmark = pytest.mark.integration
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
KEY = AssetKey("train_test_model")


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def train(env: dict, instance: DagsterInstance, partition: str, job_path: Path | None = None):
    job_path = job_path or env["job_path"]
    asset = build_training_asset(load_job_spec(job_path), job_path)
    resources = {
        "storage": PrimusStorageResource(data_root=str(env["root"])),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }
    return materialize(
        [asset], partition_key=partition, instance=instance, resources=resources, run_config=QUIET, raise_on_error=False
    )


def metadata(result) -> dict:
    (event,) = result.get_asset_materialization_events()
    return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}


def test_the_training_asset_depends_on_its_previous_partition(tmp_path: Path) -> None:
    env = make_job(tmp_path, hours=0, extra_training="partition: hour\nbatch_lag: 1h\nauc_tolerance: 1")
    asset = build_training_asset(env["job"], env["job_path"])
    mapping = asset.get_partition_mapping(KEY)
    assert isinstance(mapping, TimeWindowPartitionMapping)
    assert (mapping.start_offset, mapping.end_offset) == (-1, -1)


def test_partitions_train_in_order_and_a_missing_predecessor_is_never_silent(
    tmp_path: Path, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    env = make_job(
        tmp_path / "data",
        hours=4,
        rows_per_hour=600,
        # 600 rows an hour teach the model nothing: the order is under test, not what it learns
        extra_training="partition: hour\nbatch_lag: 1h\nauc_tolerance: 1\nbaseline_guard: warn",
    )
    runs = []
    for partition in ("2026-11-01-01:00", "2026-11-01-02:00", "2026-11-01-03:00"):
        result = train(env, instance, partition)
        assert result.success
        runs.append(metadata(result))
    assert runs[0]["cold_start"] == "first training partition" and "warm_started_from" not in runs[0]
    assert runs[1]["warm_started_from"] == runs[0]["mlflow_run_id"]  # each continues the one before
    assert runs[2]["warm_started_from"] == runs[1]["mlflow_run_id"]

    # 05:00 out of order: 04:00 never trained, and cold_start defaults to first_partition.
    skipped = train(env, instance, "2026-11-01-05:00")
    assert not skipped.success
    (failure,) = [e for e in skipped.all_events if e.is_step_failure]
    cause = failure.step_failure_data.error.cause
    message = cause.message
    assert cause.cls_name == "MissingPredecessorError"
    assert "no finished run 'train-test/2026-11-01-04:00'" in message and "automation.cold_start: allow" in message
    assert "2026-11-01-05:00" not in instance.get_materialized_partitions(KEY)

    allowing = env["job_path"].with_name("job_allow.yaml")
    allowing.write_text(env["job_path"].read_text() + "automation: {cold_start: allow}\n")
    fresh = train(env, instance, "2026-11-01-05:00", allowing)
    assert fresh.success
    meta = metadata(fresh)
    assert "warm_started_from" not in meta
    assert meta["cold_start"] == "no finished run 'train-test/2026-11-01-04:00' with a checkpoint to warm-start from"

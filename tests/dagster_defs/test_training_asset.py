"""The training asset in-process: lagged partition mappings, metadata, and the AUC check across
two partitions (real data plane processes and MLflow on SQLite)."""

from __future__ import annotations

import sys
from pathlib import Path

import mlflow
import pytest
from dagster import AssetKey, DagsterInstance, materialize

from primus_dagster.dagster_defs import (
    ExecutorPoolResource,
    MlflowResource,
    PrimusStorageResource,
    build_training_asset,
)
from primus_dagster.dagster_defs.training_asset import auc_check, source_deps, training_partitions_def

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from jobkit import make_job

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def test_partitions_start_where_lagged_batch_data_exists_and_batch_deps_are_shifted(tmp_path: Path) -> None:
    env = make_job(tmp_path, hours=0, extra_training="partition: hour\nbatch_lag: 2h")
    job = env["job"]
    assert training_partitions_def(job).get_first_partition_key() == "2026-11-01-02:00"
    deps = {d.asset_key.to_user_string(): d.partition_mapping for d in source_deps(job)}
    assert (deps["imp"].start_offset, deps["imp"].end_offset) == (-2, -2)  # batch: two hours back
    assert (deps["events"].start_offset, deps["events"].end_offset) == (0, 0)  # stream: the same hour
    daily = make_job(tmp_path / "daily", hours=0, extra_training="partition: day\nbatch_lag: 24h")["job"]
    assert training_partitions_def(daily).get_first_partition_key() == "2026-11-02"
    assert {d.asset_key.to_user_string(): d.partition_mapping.start_offset for d in source_deps(daily)}["imp"] == -1


def test_auc_check_passes_within_tolerance_and_fails_past_it(tmp_path: Path) -> None:
    job = make_job(tmp_path, hours=0)["job"]  # auc_tolerance: 0.005 (default)
    assert auc_check(job, 0.70, None).passed
    assert auc_check(job, 0.697, 0.70).passed
    failed = auc_check(job, 0.69, 0.70)
    assert not failed.passed and failed.metadata["drop"].value == pytest.approx(0.01)
    assert not auc_check(job, None, 0.7).passed


@pytest.mark.integration
def test_two_partitions_materialise_with_metadata_and_the_check_compares_with_the_previous(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    env = make_job(tmp_path / "data", mode="mixed", hours=4, extra_training="partition: hour\nbatch_lag: 1h")
    asset = build_training_asset(env["job"], env["job_path"])
    resources = {
        "storage": PrimusStorageResource(data_root=str(env["root"])),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }
    instance = DagsterInstance.ephemeral()
    key = AssetKey("train_test_model")
    for partition in ("2026-11-01-01:00", "2026-11-01-02:00"):  # the first two: partitions train in order
        result = materialize([asset], partition_key=partition, instance=instance, resources=resources, run_config=QUIET)
        assert result.success
        (event,) = result.get_asset_materialization_events()
        meta = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
        assert meta["samples"] > 0 and meta["mlflow_run_id"] and meta["model_uri"].startswith("models:/")
        assert meta["window_start"].startswith(partition[:10]) and 0.0 <= meta["eval_auc"] <= 1.0
        (check,) = result.get_asset_check_evaluations()
        assert check.asset_key == key
        if partition.endswith("01:00"):
            first_run = meta["mlflow_run_id"]
            assert "warm_started_from" not in meta  # None: nothing before the first partition
    assert meta["warm_started_from"] == first_run  # continuous training: day 2 goes on from day 1's model
    # The MLflow run leads back to the Dagster run, asset and partition; its experiment opens on models.
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    run = client.get_run(meta["mlflow_run_id"])
    assert run.data.tags["dagster.run_id"] == result.run_id and run.data.tags["dagster.asset"] == "train_test_model"
    assert run.data.tags["dagster.partition"] == "2026-11-01-02:00"
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert check.metadata["previous_auc"].value == pytest.approx(
        instance.fetch_materializations(key, limit=2).records[1].asset_materialization.metadata["eval_auc"].value
    )

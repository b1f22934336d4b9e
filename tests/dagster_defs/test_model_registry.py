"""The live model asset and the model registry: each increment is a registered version of the job's
model, tagged with its run key, base, records and Dagster run, and the alias ``live`` (not ``champion``,
which only a checked training partition moves) follows it; its metadata is typed. (The training asset's
versions and ``champion`` are in test_training_asset.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import mlflow
import pytest
from dagster import AssetKey, DagsterInstance, MetadataValue, materialize

from primus_dagster.dagster_defs import ExecutorPoolResource, KafkaResource, MlflowResource, PrimusStorageResource
from primus_dagster.dagster_defs.live_asset import LIVE_ALIAS, build_live_asset
from primus_dagster.dagster_defs.source_assets import build_source_assets
from primus_dagster.dagster_defs.training_asset import CHAMPION_ALIAS
from primus_dagster.training.tracking import MlflowTracker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from jobkit import make_job

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

pytestmark = [
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
    pytest.mark.filterwarnings("ignore:.*Any type hint is inferred as AnyType:UserWarning"),
]


def test_source_asset_descriptions_write_durations_as_the_spec_does(tmp_path: Path) -> None:
    job = make_job(tmp_path, hours=0)["job"]
    descriptions = [d for asset in build_source_assets(job) for d in asset.descriptions_by_key.values()]
    assert descriptions and all("label delay 0s" in d for d in descriptions)  # not "0:00:00"
    assert not any("0:00:00" in d for d in descriptions)


@pytest.mark.integration
def test_a_live_increment_is_a_registered_version_under_the_live_alias(tmp_path: Path, kafka_broker) -> None:
    env = make_job(tmp_path, kafka=kafka_broker.bootstrap_servers, topic="registry-live", hours=1, rows_per_hour=600)
    job = env["job"]
    asset = build_live_asset(job, env["job_path"])
    resources = {
        "storage": PrimusStorageResource(
            data_root=str(env["root"]), kafka=KafkaResource(bootstrap_servers=kafka_broker.bootstrap_servers)
        ),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }
    instance = DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))  # else a temp dir left behind
    result = materialize([asset], instance=instance, resources=resources, run_config=QUIET)
    assert result.success
    (event,) = result.get_asset_materialization_events()
    assert event.asset_key == AssetKey("train_test_live_model")
    meta = event.materialization.metadata
    assert meta["new_records"].value > 0 and meta["dagster/row_count"] == MetadataValue.int(meta["samples"].value)
    assert meta["model_version"] == MetadataValue.int(1) and meta["registered_model"] == MetadataValue.text(
        "train-test"
    )
    assert isinstance(meta["tail"], type(MetadataValue.json({})))
    assert meta["mlflow_run_url"] == MetadataValue.text(meta["mlflow_run_url"].value)  # sqlite: text, not a url

    tracker = MlflowTracker(job.tracking.tracking_uri, job.tracking.experiment)
    assert tracker.alias_version("train-test", LIVE_ALIAS) == "1"
    assert tracker.alias_version("train-test", CHAMPION_ALIAS) is None  # only a checked partition is a champion
    version = tracker.client.get_model_version("train-test", "1")
    assert version.tags["primus.run_kind"] == "live" and version.tags["dagster.run_id"] == result.run_id
    assert version.tags["primus.live_run_key"] == meta["live_run_key"].value
    assert int(version.tags["primus.new_records"]) == meta["new_records"].value
    assert version.run_id == meta["mlflow_run_id"].value and version.source == meta["model_uri"].value
    client = mlflow.MlflowClient(job.tracking.tracking_uri)
    assert str(client.get_model_version_by_alias("train-test", LIVE_ALIAS).version) == "1"

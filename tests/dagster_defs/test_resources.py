"""Resources: EnvVar defaults only for the variables that are set, the Kafka resource nested in the
storage resource, and the fallback to the embedded broker's state file."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import EnvVar, materialize

from primus_dagster.dagster_defs import (
    KafkaResource,
    MlflowResource,
    PrimusStorageResource,
    build_source_assets,
    default_resources,
)
from primus_dagster.spec import parse_job_spec

ENV_VARS = ("PRIMUS_DATA_ROOT", "PRIMUS_KAFKA_BOOTSTRAP_SERVERS", "MLFLOW_TRACKING_URI")


def kafka_source(bootstrap_servers: str | None = None):
    own = f", bootstrap_servers: '{bootstrap_servers}'" if bootstrap_servers else ""
    job = parse_job_spec(f"""
name: k
dataset:
  start: 2026-11-01
  streams:
    - name: live
      window: 1h
      sources:
        - {{name: events, type: kafka, kind: stream, topic: t{own}, columns: {{ts: t, label: y, id: id, dense: [d]}}}}
""")
    return job.dataset.source("events")


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_default_resources_without_env_vars_use_the_embedded_defaults(no_env: Path) -> None:
    resources = default_resources()
    storage = resources["storage"]
    assert set(resources) == {"storage", "mlflow", "executor_pool"}
    assert storage.data_root == str(no_env / "data") and not isinstance(storage.data_root, EnvVar)
    assert storage.kafka.bootstrap_servers is None
    assert storage.kafka.broker_state_file == str(no_env / "broker.json")
    assert resources["mlflow"].tracking_uri is None


def test_default_resources_take_set_env_vars_as_env_var_config(no_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIMUS_DATA_ROOT", "/data")
    monkeypatch.setenv("PRIMUS_KAFKA_BOOTSTRAP_SERVERS", "broker-1:9092")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    resources = default_resources()
    assert resources["storage"].data_root == EnvVar("PRIMUS_DATA_ROOT")
    assert resources["storage"].kafka.bootstrap_servers == EnvVar("PRIMUS_KAFKA_BOOTSTRAP_SERVERS")
    assert resources["mlflow"].tracking_uri == EnvVar("MLFLOW_TRACKING_URI")


def test_a_run_resolves_the_env_var_data_root(no_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    job = parse_job_spec("""
name: t
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 1h
      sources:
        - {name: clicks, type: parquet, path: pq, columns: {ts: event_time, label: click, id: sample_id, dense: [d0]}}
""")
    directory = tmp_path / "data" / "pq" / "dt=2026-11-01" / "hour=00"
    directory.mkdir(parents=True)
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    pq.write_table(
        pa.table(
            {
                "sample_id": pa.array(range(7), pa.int64()),
                "event_time": pa.array([start + timedelta(minutes=i) for i in range(7)], pa.timestamp("us", tz="UTC")),
                "click": pa.array([0, 1] * 3 + [0], pa.int32()),
                "d0": pa.array([0.5] * 7, pa.float32()),
            }
        ),
        directory / "part-0.parquet",
    )
    (directory / "_SUCCESS").touch()
    monkeypatch.setenv("PRIMUS_DATA_ROOT", str(tmp_path / "data"))
    result = materialize(build_source_assets(job), partition_key="2026-11-01-00:00", resources=default_resources())
    assert result.get_asset_materialization_events()[0].materialization.metadata["rows"].value == 7


def test_kafka_resource_without_any_broker_names_the_options(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"PRIMUS_KAFKA_BOOTSTRAP_SERVERS.*none\.json"):
        KafkaResource(broker_state_file=str(tmp_path / "none.json")).resolve_bootstrap_servers()


def test_kafka_resource_falls_back_to_the_running_embedded_broker(kafka_broker, tmp_path: Path) -> None:
    state_file = tmp_path / "broker.json"
    state_file.write_text(json.dumps({"pid": kafka_broker.pid, "bootstrap_servers": kafka_broker.bootstrap_servers}))
    assert (
        KafkaResource(broker_state_file=str(state_file)).resolve_bootstrap_servers() == kafka_broker.bootstrap_servers
    )
    assert KafkaResource(bootstrap_servers="b:9092", broker_state_file=str(state_file)).resolve_bootstrap_servers() == (
        "b:9092"
    )


def test_storage_resolves_its_nested_kafka_only_for_sources_that_need_it() -> None:
    bare = PrimusStorageResource(data_root="/data")
    assert bare.source_context().kafka_bootstrap_servers is None
    assert bare.source_context([kafka_source("own:9092")]).kafka_bootstrap_servers is None
    with pytest.raises(RuntimeError, match=r"\['events'\].*kafka=KafkaResource"):
        bare.source_context([kafka_source()])
    storage = PrimusStorageResource(data_root="/data", kafka=KafkaResource(bootstrap_servers="b:9092"))
    context = storage.source_context([kafka_source()])
    assert (context.data_root, context.kafka_bootstrap_servers) == ("/data", "b:9092")


def test_mlflow_resource_overrides_the_spec_which_overrides_the_default(tmp_path: Path) -> None:
    spec_uri, resource_uri = f"sqlite:///{tmp_path / 'spec.db'}", f"sqlite:///{tmp_path / 'resource.db'}"
    job = parse_job_spec(f"""
name: m
dataset:
  start: 2026-11-01
  streams:
    - {{name: s, window: 1h, sources: [{{name: c, type: parquet, path: p, columns: {{ts: t, label: y, dense: [d]}}}}]}}
tracking: {{tracking_uri: "{spec_uri}", experiment: from-spec}}
""")
    overridden = MlflowResource(tracking_uri=resource_uri).tracker(job)
    assert (overridden.tracking_uri, overridden.experiment) == (resource_uri, "from-spec")
    assert MlflowResource().tracker(job).tracking_uri == spec_uri

"""Planted secrets never show: a job spec carrying an AWS secret key and a token in ``storage_options``,
a token in an Iceberg catalog's properties, a password in its catalog URI and a Kafka SASL password goes
through ``validate`` (valid and invalid), ``plan``, a small ``train`` and a Dagster materialisation of
its source and training assets; stdout/stderr, the Dagster event log and metadata, and every MLflow
param, tag and text artifact are scanned for the planted values. A Kafka SASL password is only ever named
(``sasl_password_env``): written inline it is refused, and the client settings read from the variable are
masked by ``redact``. So is a schema registry password (``schema_registry_password_env``, ``format: avro``):
refused inline, and sent only in the registry request's basic-auth header, never in an error."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import mlflow
import pytest
from dagster import DagsterInstance, materialize

from primus_dagster.dagster_defs import (
    ExecutorPoolResource,
    MlflowResource,
    PrimusStorageResource,
    build_source_assets,
    build_training_asset,
)
from primus_dagster.dagster_defs.training_asset import training_partitions_def
from primus_dagster.data.sources import SourceContext
from primus_dagster.spec import load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
    pytest.mark.filterwarnings("ignore:.*Any type hint is inferred as AnyType:UserWarning"),
]

AWS = "AWSs3cr3tPLANTED0a1b2c3d4e5f"
TOKEN = "tok3nPLANTED9z8y7x6w"
CATALOG_PASSWORD = "catPWPLANTED42"
SASL = "saslPWPLANTED77"
REGISTRY_PASSWORD = "regPWPLANTED55"
PLANTED = (AWS, TOKEN, CATALOG_PASSWORD, SASL, REGISTRY_PASSWORD)
PRIMUS = [sys.executable, "-m", "primus_dagster.cli"]
COLUMNS = "{ts: event_time, label: click, id: sample_id, dense: [d0, d1, d2], sparse: [user_id, item_id]}"

SPEC = f"""
name: secrets
data: {{lease: 5s}}
pools: {{data: {{replicas: 1, task_runners: 1}}, training: {{replicas: 1}}}}
dataset:
  start: 2026-11-01
  streams:
    - name: s
      window: 1h
      sources:
        - name: imp
          type: parquet
          kind: batch
          batch_rows: 500
          path: parquet/impressions
          storage_options: {{aws_secret_access_key: {AWS}, token: {TOKEN}}}
          columns: {COLUMNS}
training:
  mode: batch
  partition: hour
  batch_lag: 0s
  model: {{type: single, embedding_dim: 4, hash_buckets: 1024, memory_hidden: [8], adapt_hidden: [8]}}
  batch_size: 500
  checkpoint_every_steps: 2
tracking: {{tracking_uri: "sqlite:///{{root}}/mlflow.db", experiment: secrets}}
"""

# Not readable (a catalog nobody serves, a Kafka SASL password written inline): errors, not data.
ICEBERG = f"""
        - name: ice
          type: iceberg
          kind: batch
          table: ns.t
          catalog: {{uri: "postgresql://primus:{CATALOG_PASSWORD}@127.0.0.1:1/db", properties: {{token: {TOKEN}}}}}
          columns: {COLUMNS}
"""
KAFKA_SASL = f"""
        - name: events
          type: kafka
          kind: stream
          topic: t
          sasl_password: {SASL}
          columns: {COLUMNS}
"""


def assert_clean(where: str, text: str) -> None:
    leaked = [secret for secret in PLANTED if secret in text]
    assert not leaked, f"{where} shows planted secret(s) {leaked}:\n{text[-3000:]}"


def primus(*args: str, check_rc: int | None = 0) -> str:
    """The command's stderr, then its stdout (the last line: ``--json``'s result)."""
    done = subprocess.run([*PRIMUS, *args], capture_output=True, text=True, timeout=240)
    out = done.stderr + done.stdout
    if check_rc is not None:
        assert done.returncode == check_rc, out[-3000:]
    assert "Traceback (most recent call last)" not in out, out[-3000:]
    return out


@pytest.fixture
def world(tmp_path: Path) -> dict:
    root = tmp_path / "data"
    root.mkdir()
    spec = root / "job.yaml"
    spec.write_text(SPEC.replace("{root}", str(root)))
    job = load_job_spec(spec)
    world = SyntheticWorld(WorldConfig(seed=3, rows_per_hour=1000, n_dense=3), job.dataset.start)
    write_world(job, SourceContext(str(root)), world, range(2), files_per_hour=1, progress=False)
    return {"root": root, "spec": spec, "job": job}


def test_planted_secrets_appear_in_no_output_log_metadata_or_mlflow_record(world: dict, tmp_path: Path) -> None:
    root, spec, job = world["root"], world["spec"], world["job"]
    text = spec.read_text()

    # validate: a valid spec, a type error inside storage_options, unknown keys holding secrets
    assert_clean("validate", primus("validate", str(spec)))
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(f"token: {TOKEN}", f"token: [{TOKEN}]") + f"  secret_key: {AWS}\n")
    assert_clean("validate (type error)", primus("validate", str(bad), check_rc=2))
    sasl = tmp_path / "sasl.yaml"
    sasl.write_text(text.replace("      sources:\n", "      sources:\n" + KAFKA_SASL.lstrip("\n"), 1))
    out = primus("validate", str(sasl), check_rc=2)
    assert "sasl_password: a password is never written in the spec" in out and "`sasl_password_env`" in out
    assert_clean("validate (inline SASL password)", out)

    # plan: the readable source, and an Iceberg catalog whose URI and properties hold secrets
    assert_clean("plan", primus("plan", str(spec), "--hours", "1", "--data-root", str(root)))
    iceberg = tmp_path / "iceberg.yaml"
    iceberg.write_text(text.replace("      sources:\n", "      sources:\n" + ICEBERG.lstrip("\n"), 1))
    unreachable = primus("plan", str(iceberg), "--hours", "1", "--data-root", str(root), check_rc=1)  # a failed listing
    assert_clean("plan (unreachable catalog)", unreachable)

    # a small train, then everything MLflow holds of it
    out = primus("train", str(spec), "--hours", "1", "--data-root", str(root), "--no-eval", "--json")
    assert_clean("train", out)
    assert json.loads(out.strip().splitlines()[-1])["samples"] > 0

    # a Dagster materialisation: the source asset and a training partition, on an ephemeral instance
    instance = DagsterInstance.ephemeral(tempdir=str(tmp_path / "dagster"))  # not a temp dir of its own
    resources = {
        "storage": PrimusStorageResource(data_root=str(root)),
        "mlflow": MlflowResource(),
        "executor_pool": ExecutorPoolResource(data_executors=1),
    }
    partition = training_partitions_def(job).get_first_partition_key()
    assert partition is not None and partition.startswith(f"{job.dataset.start:%Y-%m-%d}")
    assets = [*build_source_assets(job), build_training_asset(job, spec)]
    result = materialize(assets, partition_key=partition, instance=instance, resources=resources)
    assert result.success
    for record in instance.all_logs(result.run_id):
        assert_clean("the Dagster event log", repr(record))
    for event in result.get_asset_materialization_events():
        assert_clean("Dagster metadata", repr(event.materialization.metadata))

    client = mlflow.MlflowClient(job.tracking.tracking_uri)
    experiment = client.get_experiment_by_name("secrets")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) >= 2  # the CLI's and the asset's
    for run in runs:
        assert_clean(f"MLflow params of {run.info.run_id}", json.dumps(run.data.params))
        assert_clean(f"MLflow tags of {run.info.run_id}", json.dumps(run.data.tags))
        artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
        for path in artifacts.rglob("*") if artifacts.is_dir() else []:
            if path.is_file() and path.suffix in {".yaml", ".yml", ".json", ".txt", ".md", ""}:
                assert_clean(f"MLflow artifact {path.name}", path.read_text(errors="replace"))


def test_a_window_with_nothing_ready_names_the_problem_without_the_secrets(world: dict) -> None:
    later = world["job"].dataset.start + timedelta(days=30)  # no data: the run fails with a message
    out = primus(
        "train",
        str(world["spec"]),
        "--start",
        f"{later:%Y-%m-%dT%H:%M}",
        "--hours",
        "1",
        "--data-root",
        str(world["root"]),
        "--no-eval",
        check_rc=None,
    )
    assert_clean("a failed train", out)


def test_kafka_client_settings_hold_the_password_only_where_a_client_needs_it() -> None:
    """The SASL password, read from the variable the spec names, is in the client settings and masked
    wherever they could be shown; the spec itself only names the variable."""
    from primus_dagster.data.sources.kafka.security import client_security_config
    from primus_dagster.spec import redact
    from primus_dagster.spec.sources import KafkaSourceSpec

    spec = KafkaSourceSpec.model_validate(
        {
            "name": "events",
            "type": "kafka",
            "topic": "t",
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": "trainer",
            "sasl_password_env": "EVENTS_KAFKA_PASSWORD",
            "columns": {"ts": "event_time", "dense": ["d0"]},
        }
    )
    config = client_security_config(spec, "events", environ={"EVENTS_KAFKA_PASSWORD": SASL})
    assert config["sasl_plain_password"] == SASL
    assert_clean("redacted client settings", repr(redact(config)))
    assert_clean("the spec", repr(spec) + repr(redact(spec)) + spec.model_dump_json())


REGISTRY_INLINE = f"""
        - name: events
          type: kafka
          kind: stream
          topic: t
          format: avro
          schema_registry_url: http://127.0.0.1:1
          schema_registry_user: trainer
          schema_registry_password: {REGISTRY_PASSWORD}
          columns: {COLUMNS}
"""


def test_a_schema_registry_password_is_only_named_and_sent_only_to_the_registry(tmp_path: Path) -> None:
    """Inline, it is refused naming ``schema_registry_password_env`` and not shown; read from the variable,
    it reaches the registry (basic auth) and no error: a refused login names the variable, not the value."""
    import importlib.util

    kit_path = Path(__file__).parent / "data" / "sources" / "registry_testkit.py"
    kit_spec = importlib.util.spec_from_file_location("registry_testkit", kit_path)
    assert kit_spec is not None and kit_spec.loader is not None
    kit = importlib.util.module_from_spec(kit_spec)
    kit_spec.loader.exec_module(kit)
    TestRegistry, framed = kit.TestRegistry, kit.framed

    from primus_dagster.data.sources.kafka import AvroRecordDecoder, SchemaRegistryError
    from primus_dagster.spec import redact
    from primus_dagster.spec.sources import KafkaSourceSpec

    inline = tmp_path / "registry.yaml"
    text = SPEC.replace("{root}", str(tmp_path))
    inline.write_text(text.replace("      sources:\n", "      sources:\n" + REGISTRY_INLINE.lstrip("\n"), 1))
    out = primus("validate", str(inline), check_rc=2)
    assert "schema_registry_password: a password is never written in the spec" in out
    assert "`schema_registry_password_env`" in out
    assert_clean("validate (inline registry password)", out)

    fields = [{"name": "event_time", "type": "long"}, {"name": "d0", "type": "float"}]
    schema = {"type": "record", "name": "E", "fields": fields}
    with TestRegistry(user="trainer", password=REGISTRY_PASSWORD) as registry:
        sid = registry.register("t-value", schema)
        spec = KafkaSourceSpec.model_validate(
            {
                "name": "events",
                "type": "kafka",
                "topic": "t",
                "format": "avro",
                "schema_registry_url": registry.url,
                "schema_registry_user": "trainer",
                "schema_registry_password_env": "EVENTS_REGISTRY_PASSWORD",
                "columns": {"ts": "event_time", "dense": ["d0"]},
            }
        )
        assert_clean("the spec", repr(spec) + repr(redact(spec)) + spec.model_dump_json())
        good = AvroRecordDecoder(spec, environ={"EVENTS_REGISTRY_PASSWORD": REGISTRY_PASSWORD})
        table, bad = good.decode([framed(sid, schema, {"event_time": 5, "d0": 1.0})], [0])
        assert bad == [] and table is not None and table.num_rows == 1
        wrong = AvroRecordDecoder(spec, environ={"EVENTS_REGISTRY_PASSWORD": REGISTRY_PASSWORD[::-1]})
        with pytest.raises(SchemaRegistryError, match="HTTP 401") as refused:
            wrong.decode([framed(sid, schema, {"event_time": 5, "d0": 1.0})], [0])
        assert_clean("a refused registry login", str(refused.value))
        assert REGISTRY_PASSWORD[::-1] not in str(refused.value)

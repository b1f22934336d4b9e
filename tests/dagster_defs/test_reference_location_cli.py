"""The reference code location through Dagster's own CLI and webserver (real processes).

`dagster asset materialize -m definitions --select <source> --partition <hour>` for each of
the four source kinds against data written by `synth` (resources from `EnvVar`s resolved in the
step processes), then the run's metadata and checks are read back from the Dagster instance; a
partition whose rows lie in another hour is materialised and fails its blocking check; and
`dagster dev` serves the code location over GraphQL.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from locationkit import DAGSTER, REPO, reference_env

from primus_dagster.devtools.kafka_broker import EmbeddedBroker
from primus_dagster.devtools.processes import stop_process_tree
from primus_dagster.ports import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The reference world in a broker of this module's own (the spec's topic is fixed: see own_kafka_broker)."""
    home = tmp_path_factory.mktemp("primus_home")
    with EmbeddedBroker(log_path=str(tmp_path_factory.mktemp("kafka-broker") / "tansu.log")) as broker:
        yield reference_env(home, broker.bootstrap_servers, hours=2, rows_per_hour=300, timeout=240)


@pytest.mark.parametrize(
    "asset,version_key",
    [
        ("impressions_parquet", None),
        ("impressions_delta", "version"),
        ("impressions_iceberg", "version"),
        ("events_kafka", "kafka_offsets"),
    ],
)
def test_cli_materializes_each_source_kind(world_env: dict[str, str], asset: str, version_key: str | None) -> None:
    proc = subprocess.run(
        [DAGSTER, "asset", "materialize", "-m", "definitions", "--select", asset, "--partition", "2026-11-01-00:00"],
        cwd=REPO,
        env=world_env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latest = latest_run_record(world_env, asset)
    assert latest["metadata"]["rows"] > 0 and latest["metadata"]["arrow_bytes"] > 0
    if version_key:
        assert latest["metadata"][version_key] not in (None, "", {})
    assert latest["checks"] == {
        "no_unreadable_files": True,
        "schema_matches_spec": True,
        "not_empty": True,
        "event_times_in_partition": True,
        "label_rate_in_range": True,
        "freshness": True,
    }


READ_LATEST_RUN = """
import json, sys
from dagster import AssetKey, DagsterEventType, DagsterInstance
instance = DagsterInstance.get()
event = instance.get_latest_materialization_event(AssetKey(sys.argv[1]))
checks = {
    record.dagster_event.event_specific_data.check_name: record.dagster_event.event_specific_data.passed
    for record in instance.all_logs(event.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
}
metadata = {k: getattr(v, "value", None) for k, v in event.asset_materialization.metadata.items()
            if k != "dagster/column_schema"}  # a TableSchema is not JSON
print(json.dumps({"partition": event.asset_materialization.partition, "metadata": metadata, "checks": checks},
                 default=str))
"""


def latest_run_record(env: dict[str, str], asset: str) -> dict:
    """The latest materialisation of ``asset`` (partition, metadata) and its run's check outcomes."""
    out = subprocess.run(
        [sys.executable, "-c", READ_LATEST_RUN, asset], cwd=REPO, env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_cli_materializes_a_faulty_partition_and_fails_its_blocking_check(world_env: dict[str, str]) -> None:
    hive = Path(world_env["PRIMUS_DATA_ROOT"]) / "parquet" / "impressions" / "dt=2026-11-01"
    shutil.copytree(hive / "hour=00", hive / "hour=05")  # hour 0's rows under hour 5
    proc = subprocess.run(
        [
            DAGSTER,
            "asset",
            "materialize",
            "-m",
            "definitions",
            "--select",
            "impressions_parquet",
            "--partition",
            "2026-11-01-05:00",
        ],
        cwd=REPO,
        env=world_env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode != 0
    assert "event_times_in_partition" in proc.stdout + proc.stderr
    latest = latest_run_record(world_env, "impressions_parquet")
    assert latest["partition"] == "2026-11-01-05:00" and latest["metadata"]["rows"] > 0
    assert latest["checks"] == {
        "no_unreadable_files": True,
        "schema_matches_spec": True,
        "not_empty": True,
        "event_times_in_partition": False,
        "label_rate_in_range": True,
        "freshness": True,
    }


ASSET_NODES_QUERY = """{ assetNodes { assetKey { path } partitionDefinition { type }
  assetChecksOrError { ... on AssetChecks { checks { name } } } } }"""


def test_dagster_dev_serves_the_code_location(world_env: dict[str, str]) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [DAGSTER, "dev", "-p", str(port), "-h", "127.0.0.1"],
        cwd=REPO,
        env=world_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        query = json.dumps({"query": ASSET_NODES_QUERY}).encode()
        deadline = time.monotonic() + 90
        nodes = None
        while time.monotonic() < deadline:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/graphql", data=query, headers={"Content-Type": "application/json"}
                )
                body = json.loads(urllib.request.urlopen(request, timeout=5).read())
                nodes = body.get("data", {}).get("assetNodes")
                if nodes:
                    break
            except OSError:
                pass
            time.sleep(1)
        assert nodes, "dagster dev did not serve the asset graph within 90 s"
        names = {node["assetKey"]["path"][-1] for node in nodes}
        assert {"impressions_parquet", "impressions_delta", "impressions_iceberg", "events_kafka"} <= names
        partitioned = {n["assetKey"]["path"][-1]: (n["partitionDefinition"] or {}).get("type") for n in nodes}
        assert partitioned.pop("ctr_demo_live_model") is None  # the live model: one, always the newest
        assert set(partitioned.values()) == {"TIME_WINDOW"}
        checks = {
            node["assetKey"]["path"][-1]: {c["name"] for c in node["assetChecksOrError"]["checks"]} for node in nodes
        }
        assert "schema_matches_spec" in checks["impressions_parquet"] and checks["ctr_demo_model"] == {
            "auc_not_regressed",
            "auc_final",
        }
    finally:
        stop_process_tree(proc)


def test_dg_launch_materializes_a_partition(world_env: dict[str, str]) -> None:
    """`dg launch`, the successor of `dagster asset materialize`, works on the same module."""
    dg = str(Path(sys.executable).with_name("dg"))
    proc = subprocess.run(
        [dg, "launch", "-m", "definitions", "--assets", "impressions_parquet", "--partition", "2026-11-01-01:00"],
        cwd=REPO,
        env=world_env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "RUN_SUCCESS" in proc.stdout + proc.stderr

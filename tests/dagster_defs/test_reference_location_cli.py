"""The reference code location through Dagster's own CLI and webserver (real processes).

`dagster asset materialize -m definitions --select <sources> --partition <hour>` of the four source
kinds at once against data written by `synth` (resources from `EnvVar`s resolved in the run's
process: its steps run there), then each asset's metadata and checks are read back from the Dagster instance; a partition
whose rows lie in another hour is materialised and fails its blocking check; `dg launch` materialises
one too. (`dagster dev` serving the code location over GraphQL and in a browser: tests/devtools/test_demo.py.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from locationkit import REPO, materialize_cli, reference_env

from primus_dagster.devtools.kafka_broker import EmbeddedBroker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The reference world in a broker of this module's own (the spec's topic is fixed: see own_kafka_broker)."""
    home = tmp_path_factory.mktemp("primus_home")
    with EmbeddedBroker(log_path=str(tmp_path_factory.mktemp("kafka-broker") / "tansu.log")) as broker:
        yield reference_env(home, broker.bootstrap_servers, hours=2, rows_per_hour=300, timeout=240)


#: Each source kind of the reference job, and the metadata entry that holds its version (None: a file source has none).
SOURCE_KINDS = {
    "impressions_parquet": None,
    "impressions_delta": "version",
    "impressions_iceberg": "version",
    "events_kafka": "kafka_offsets",
}
ALL_PASSED = {
    "no_unreadable_files": True,
    "schema_matches_spec": True,
    "not_empty": True,
    "event_times_in_partition": True,
    "label_rate_in_range": True,
    "freshness": True,
}


def test_cli_materializes_each_source_kind(world_env: dict[str, str]) -> None:
    """One ``dagster asset materialize`` of the four sources (one partition key, one run: each asset a step)."""
    proc = materialize_cli(world_env, ",".join(SOURCE_KINDS), "2026-11-01-00:00")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    latest = latest_run_records(world_env, *SOURCE_KINDS)
    for asset, version_key in SOURCE_KINDS.items():
        metadata = latest[asset]["metadata"]
        assert metadata["rows"] > 0 and metadata["arrow_bytes"] > 0, asset
        if version_key:
            assert metadata[version_key] not in (None, "", {}), asset
        assert latest[asset]["checks"] == ALL_PASSED, asset


READ_LATEST_RUNS = """
import json, sys
from dagster import AssetKey, DagsterEventType, DagsterInstance
instance = DagsterInstance.get()
out = {}
for asset in sys.argv[1:]:
    event = instance.get_latest_materialization_event(AssetKey(asset))
    checks = {
        record.dagster_event.event_specific_data.check_name: record.dagster_event.event_specific_data.passed
        for record in instance.all_logs(event.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        if record.dagster_event.event_specific_data.asset_key == AssetKey(asset)
    }
    metadata = {k: getattr(v, "value", None) for k, v in event.asset_materialization.metadata.items()
                if k != "dagster/column_schema"}  # a TableSchema is not JSON
    out[asset] = {"partition": event.asset_materialization.partition, "metadata": metadata, "checks": checks}
print(json.dumps(out, default=str))
"""


def latest_run_records(env: dict[str, str], *assets: str) -> dict[str, dict]:
    """Per asset, its latest materialisation (partition, metadata) and its run's check outcomes on it."""
    out = subprocess.run(
        [sys.executable, "-c", READ_LATEST_RUNS, *assets], cwd=REPO, env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_cli_materializes_a_faulty_partition_and_fails_its_blocking_check(world_env: dict[str, str]) -> None:
    hive = Path(world_env["PRIMUS_DATA_ROOT"]) / "parquet" / "impressions" / "dt=2026-11-01"
    shutil.copytree(hive / "hour=00", hive / "hour=05")  # hour 0's rows under hour 5
    proc = materialize_cli(world_env, "impressions_parquet", "2026-11-01-05:00")
    assert proc.returncode != 0
    assert "event_times_in_partition" in proc.stdout + proc.stderr
    latest = latest_run_records(world_env, "impressions_parquet")["impressions_parquet"]
    assert latest["partition"] == "2026-11-01-05:00" and latest["metadata"]["rows"] > 0
    assert latest["checks"] == ALL_PASSED | {"event_times_in_partition": False}


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

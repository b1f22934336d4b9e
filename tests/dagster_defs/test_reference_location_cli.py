"""The reference code location through Dagster's own CLI and webserver (real processes).

`dagster asset materialize -m definitions --select <source> --partition <hour>` for each of
the four source kinds against data written by `synth`, then the run's metadata is read back
from the Dagster instance; and `dagster dev` serves the code location over GraphQL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from primus_dagster.kafka_broker import free_port

REPO = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
PRIMUS = str(Path(sys.executable).with_name("primus-dagster"))

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world_env(tmp_path_factory: pytest.TempPathFactory, kafka_broker) -> dict[str, str]:
    home = tmp_path_factory.mktemp("primus_home")
    env = dict(os.environ)
    env.update(
        {
            "PRIMUS_HOME": str(home),
            "PRIMUS_DATA_ROOT": str(home / "data"),
            "DAGSTER_HOME": str(home / "dagster_home"),
            "PRIMUS_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
        }
    )
    (home / "dagster_home").mkdir()
    (home / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    subprocess.run(
        [PRIMUS, "synth", "--spec", "examples/job.yaml", "--hours", "2", "--rows-per-hour", "300"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return env


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
    script = f"""
import json
from dagster import AssetKey, DagsterInstance
instance = DagsterInstance.get()
event = instance.get_latest_materialization_event(AssetKey({asset!r}))
meta = event.asset_materialization.metadata
print(json.dumps({{k: getattr(v, "value", None) for k, v in meta.items()}}, default=str))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=world_env, capture_output=True, text=True, check=True
    ).stdout
    meta = json.loads(out.strip().splitlines()[-1])
    assert meta["rows"] > 0 and meta["arrow_bytes"] > 0
    if version_key:
        assert meta[version_key] not in (None, "", {})


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
        query = json.dumps({"query": "{ assetNodes { assetKey { path } partitionDefinition { type } } }"}).encode()
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
        assert all(node["partitionDefinition"]["type"] == "TIME_WINDOW" for node in nodes)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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

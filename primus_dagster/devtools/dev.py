"""``make dev``: the reference deployment in ``dagster dev``, with a served MLflow and the demo's stream.

One command a user runs after ``make demo``:

1. the embedded broker, started again with the records the demo saved (``devtools/broker_records.py``)
   when there is a save and none runs -- so the UI re-executes the demo's Kafka runs;
2. an MLflow tracking server (``mlflow server``) on the project's SQLite store and artifact folder, unless
   ``$MLFLOW_TRACKING_URI`` names one already; the code location tracks through it
   (``MLFLOW_TRACKING_URI=http://127.0.0.1:<port>``), so every ``mlflow_run_url`` in the Dagster UI is a
   link to that run's MLflow page;
3. ``dagster dev`` (webserver and daemon) on ``workspace.yaml``.

Ctrl-C (or SIGTERM) stops ``dagster dev`` and the MLflow server with everything they started; the broker
keeps running, like one started with ``primus-dagster-dev broker --detach`` (``--stop`` saves and stops it).

Example::

    primus-dagster-dev dev                       # UI on http://127.0.0.1:3000, MLflow on :5000
    primus-dagster-dev dev --port 3001 --mlflow-port 5001 -- --code-server-log-level debug
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import psutil

from primus_dagster import paths
from primus_dagster.devtools.processes import stop_process_tree
from primus_dagster.ports import free_port

_BIN = Path(sys.executable).parent

#: Set (to a value of its own) on a ``dagster dev`` / ``dagster-webserver`` this module or the demo starts, so
#: that a code server its webserver or daemon started while they were being stopped -- out of their process
#: tree by then, waiting for a heartbeat timeout -- is found and stopped too (:func:`stop_stragglers`).
STRAGGLER_ENV = "PRIMUS_SERVER_TOKEN"


class DevError(RuntimeError):
    """A server ``make dev`` starts did not come up (with the tail of its log)."""


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) != 0


def serve_mlflow(
    tracking_uri: str,
    log_path: Path,
    env: dict[str, str] | None = None,
    port: int | None = None,
    artifact_root: Path | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start an MLflow tracking server (one worker, no job runner unless ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION``
    says so, its own session: stop it with :func:`~.processes.stop_process_tree`) on ``tracking_uri``'s store;
    returns the process and its URL.
    ``port`` None: a free one. ``artifact_root``: where runs of experiments it creates keep artifacts (a
    local folder, written by the clients directly, as with the SQLite store itself)."""
    port = port or free_port()
    # MLflow 3's server also starts a job runner (huey consumers, for its GenAI scorers and periodic jobs) that
    # polls all the time -- over a runnable task of load on an idle machine; a tracking server needs none.
    env = {**(os.environ if env is None else env)}
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    command = [str(_BIN / "mlflow"), "server", "--backend-store-uri", tracking_uri]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    if artifact_root is not None:
        command += ["--default-artifact-root", str(artifact_root), "--no-serve-artifacts"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    return proc, f"http://127.0.0.1:{port}"


def wait_http(
    url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None, log_path: Path | None = None
) -> None:
    """Until ``url`` answers (any HTTP status below 500); :class:`DevError` after ``timeout_s`` or when
    ``proc`` exits first, with the tail of ``log_path``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            time.sleep(0.5)
    tail = ""
    if log_path is not None and log_path.exists():
        tail = "\n" + "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
    raise DevError(f"{url} did not answer within {timeout_s:g}s{tail}")


def _marked(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(STRAGGLER_ENV) == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # gone, or not ours to read
            continue
    return found


def stop_stragglers(token: str, grace_s: float = 5.0) -> None:
    """Stop what is left of a server whose tree was stopped (:data:`STRAGGLER_ENV` is ``token``): SIGTERM, then
    SIGKILL after ``grace_s``."""
    left = _marked(token)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(left, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def _start_broker(print_line: Callable[[str], None]) -> None:
    from primus_dagster.devtools.broker_records import has_saved_records
    from primus_dagster.devtools.kafka_broker import EmbeddedBroker

    state_file, records = paths.broker_state_file(), paths.broker_records_dir()
    running = EmbeddedBroker.read_state(state_file)
    if running is not None:
        print_line(f"Kafka: the embedded broker on {running['bootstrap_servers']} (already running)")
    elif has_saved_records(records):
        state = EmbeddedBroker.start_detached(state_file, records_dir=records)
        replayed = state.get("replayed") or {}
        print_line(
            f"Kafka: the embedded broker on {state['bootstrap_servers']}, {sum(replayed.values())} saved record(s) "
            f"of {len(replayed)} topic(s) replayed from {records} (`primus-dagster-dev broker --stop` saves and stops it)"
        )
    else:
        print_line("Kafka: none started (no saved records; `primus-dagster-dev broker --detach` starts one)")


def run_dev(args: argparse.Namespace) -> int:
    from primus_dagster.broker_discovery import KAFKA_ENV
    from primus_dagster.training.tracking import default_tracking_uri

    def say(line: str) -> None:
        print(line, flush=True)

    home = paths.dagster_home()
    say(f"DAGSTER_HOME {home}")
    env = {**os.environ, "DAGSTER_HOME": str(home), "PRIMUS_HOME": str(paths.primus_home())}
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if not env.get(KAFKA_ENV):
        _start_broker(say)
    servers: list[subprocess.Popen[bytes]] = []
    token = uuid.uuid4().hex

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        if env.get("MLFLOW_TRACKING_URI"):
            say(f"MLflow: {env['MLFLOW_TRACKING_URI']} ($MLFLOW_TRACKING_URI)")
        else:
            store = default_tracking_uri()
            mlflow_port = args.mlflow_port if _port_free("127.0.0.1", args.mlflow_port) else free_port()
            log_path = paths.primus_home() / "mlflow_server.log"
            proc, url = serve_mlflow(store, log_path, env, mlflow_port, paths.primus_home() / "mlflow" / "artifacts")
            servers.append(proc)
            wait_http(f"{url}/health", args.startup_timeout_s, proc, log_path)
            env["MLFLOW_TRACKING_URI"] = url
            say(f"MLflow: {url} (the store {store}; log {log_path})")
        workspace = Path(args.workspace).resolve()
        command = [str(_BIN / "dagster"), "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(args.port)]
        dagster = subprocess.Popen(
            [*command, *args.dagster_args],
            env={**env, STRAGGLER_ENV: token},
            cwd=workspace.parent,
            start_new_session=True,
        )
        servers.append(dagster)
        say(f"Dagster: http://127.0.0.1:{args.port} (Ctrl-C stops Dagster and MLflow)")
        return dagster.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        for proc in reversed(servers):
            stop_process_tree(proc)
        stop_stragglers(token)

"""Which Kafka to talk to when the user did not say.

``$PRIMUS_KAFKA_BOOTSTRAP_SERVERS``, else the embedded broker that ``primus-dagster-dev broker
--detach`` recorded in ``$PRIMUS_HOME/broker.json`` -- while its process still runs. Reading the
record needs nothing of the development tools that start the broker.

Example::

    servers = default_bootstrap_servers()      # "127.0.0.1:9092", or None: nothing configured
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psutil

from primus_dagster import paths

KAFKA_ENV = "PRIMUS_KAFKA_BOOTSTRAP_SERVERS"


def read_broker_state(state_file: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The record of a running embedded broker (``pid``, ``bootstrap_servers``, ...) in
    ``state_file`` (default: ``$PRIMUS_HOME/broker.json``); None when absent, unreadable or its
    process is gone."""
    path = Path(state_file) if state_file is not None else paths.broker_state_file()
    try:
        state = json.loads(path.read_text())
        pid = int(state["pid"])
        str(state["bootstrap_servers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        cmdline = " ".join(proc.cmdline())
    except (psutil.Error, OSError):
        return None
    if "tansu" not in cmdline or "broker" not in cmdline:  # the pid was reused by another program
        return None
    return dict(state)


def default_bootstrap_servers(state_file: str | os.PathLike[str] | None = None) -> str | None:
    """``$PRIMUS_KAFKA_BOOTSTRAP_SERVERS``, else the running embedded broker's address, else None."""
    if os.environ.get(KAFKA_ENV):
        return os.environ[KAFKA_ENV]
    state = read_broker_state(state_file)
    return None if state is None else str(state["bootstrap_servers"])

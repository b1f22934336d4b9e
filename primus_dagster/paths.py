"""Project-local default locations (embedded defaults); every one can be overridden by env."""

from __future__ import annotations

import os
from pathlib import Path


def primus_home() -> Path:
    """``$PRIMUS_HOME`` or ``./.primus``: data, Dagster home, MLflow store, broker state."""
    return Path(os.environ.get("PRIMUS_HOME") or Path.cwd() / ".primus").resolve()


def data_root() -> Path:
    """``$PRIMUS_DATA_ROOT`` or ``<home>/data``: where relative source locations resolve, and which they may not
    leave (the rule: :func:`primus_dagster.spec.sources.outside_root`)."""
    value = os.environ.get("PRIMUS_DATA_ROOT")
    return Path(value).resolve() if value else primus_home() / "data"


def broker_state_file() -> Path:
    """State file of the embedded Kafka-compatible broker started by ``primus-dagster-dev broker``."""
    return primus_home() / "broker.json"


def dagster_home() -> Path:
    """``$DAGSTER_HOME`` or ``<home>/dagster_home``, created with telemetry disabled."""
    home = Path(os.environ.get("DAGSTER_HOME") or primus_home() / "dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text("telemetry:\n  enabled: false\n")
    return home

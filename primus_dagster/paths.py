"""Project-local default locations (embedded defaults); every one can be overridden by env."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from primus_dagster.run_queue import concurrency_config, run_queue_config


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


#: What ``dagster_home`` wrote into a new instance's ``dagster.yaml`` before the run queue: such a file is
#: upgraded in place (any other file is a team's own and left as it is).
_TELEMETRY_ONLY = "telemetry:\n  enabled: false\n"
_HEADER = "# Written by primus_dagster (paths.dagster_home): edit freely, it is not rewritten.\n"


def _written_before_pools() -> str:
    """What ``dagster_home`` wrote before the pools (a ``run_queue`` section): upgraded in place too."""
    settings = {"telemetry": {"enabled": False}, "run_queue": run_queue_config()}
    return _HEADER + yaml.safe_dump(settings, sort_keys=False)


def broker_records_dir() -> Path:
    """Where a detached embedded broker saves its records when stopped and replays them from when started."""
    return primus_home() / "broker_records"


def dagster_home() -> Path:
    """``$DAGSTER_HOME`` or ``<home>/dagster_home``, created with telemetry disabled, a run queue sized to the
    machine and one run per pool at a time (:func:`primus_dagster.run_queue.concurrency_config`)."""
    home = Path(os.environ.get("DAGSTER_HOME") or primus_home() / "dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists() or config.read_text() in (_TELEMETRY_ONLY, _written_before_pools()):
        settings = {"telemetry": {"enabled": False}, "concurrency": concurrency_config()}
        config.write_text(_HEADER + yaml.safe_dump(settings, sort_keys=False))
    return home

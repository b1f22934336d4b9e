"""The reference deployment on embedded defaults in a temp ``PRIMUS_HOME``, written by ``synth``
(shared by the tests that drive it through Dagster's own CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
PRIMUS = str(Path(sys.executable).with_name("primus-dagster"))


def reference_env(
    home: Path, bootstrap_servers: str, *, hours: int, rows_per_hour: int, timeout: float
) -> dict[str, str]:
    """The environment of the reference location with data, Dagster instance and MLflow under
    ``home``, after ``synth`` wrote ``hours`` hours of the example job to every source."""
    env = {
        **os.environ,
        "PRIMUS_HOME": str(home),
        "PRIMUS_DATA_ROOT": str(home / "data"),
        "DAGSTER_HOME": str(home / "dagster_home"),
        "PRIMUS_KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        # `dagster dev` leaves its workspace temp dirs behind when it is stopped under load: keep them here
        "TMPDIR": str(home / "tmp"),
    }
    (home / "dagster_home").mkdir(parents=True)
    (home / "tmp").mkdir()
    (home / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    command = [PRIMUS, "synth", "--spec", "examples/job.yaml", "--hours", str(hours), "--rows-per-hour"]
    subprocess.run(
        [*command, str(rows_per_hour)], cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=timeout
    )
    return env

"""The reference deployment on embedded defaults in a temp ``PRIMUS_HOME``, written by ``synth``
(shared by the tests that drive it through Dagster's own CLI), and an hourly variant of its job spec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
PRIMUS = str(Path(sys.executable).with_name("primus-dagster"))


def hourly_reference_spec(directory: Path) -> Path:
    """``examples/job.yaml`` with hourly training partitions (``2026-11-02-00:00`` the first: the batch hour a
    day before and the stream hour of its window) and a 5 s sensor interval, written to ``directory``: the
    reference deployment's code paths on an hour of data instead of a day."""
    spec = yaml.safe_load((REPO / "examples" / "job.yaml").read_text())
    spec["training"]["partition"] = "hour"
    spec["automation"]["sensor_interval"] = "5s"
    path = directory / "job_hourly.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def reference_env(
    home: Path, bootstrap_servers: str, *, hours: int, rows_per_hour: int, timeout: float, spec: Path | None = None
) -> dict[str, str]:
    """The environment of the reference location with data, Dagster instance and MLflow under
    ``home``, after ``synth`` wrote ``hours`` hours of the example job (or ``spec``, which the location then
    serves) to every source."""
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
    if spec is not None:
        env["PRIMUS_JOB_SPEC"] = str(spec)
    command = [PRIMUS, "synth", "--spec", str(spec or "examples/job.yaml"), "--hours", str(hours), "--rows-per-hour"]
    subprocess.run(
        [*command, str(rows_per_hour)], cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=timeout
    )
    return env


def materialize_cli(
    env: dict[str, str], select: str, partition: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``dagster asset materialize -m definitions --select SELECT --partition PARTITION`` in the repository, with
    ``env``; its exit code and output."""
    command = [DAGSTER, "asset", "materialize", "-m", "definitions", "--select", select, "--partition", partition]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)

"""`primus-dagster-dev demo` (what `make demo` runs), end to end on embedded defaults, small: source
assets with every blocking check passed, then the MTRM training asset (batch_then_stream) logged to
MLflow, all as runs of the reference code location's own jobs (re-executable from the UI); no process
left behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from dagster import DagsterInstance, DagsterRunStatus

from primus_dagster.dagster_defs import SOURCE_CHECK_DESCRIPTIONS

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def test_demo_runs_end_to_end_and_leaves_no_process(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("PRIMUS_KAFKA_BOOTSTRAP_SERVERS", None)
    env.pop("DAGSTER_HOME", None)
    env.pop("PRIMUS_DATA_ROOT", None)
    env.update({"PRIMUS_HOME": str(tmp_path / "home"), "COLUMNS": "80", "TMPDIR": str(tmp_path / "tmp")})
    (tmp_path / "tmp").mkdir()  # MLflow's SQLite init locks land in $TMPDIR
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("primus-dagster-dev")), "demo", "--hours", "2", "--rows-per-hour", "200"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "materialised partition 2026-11-01-01:00 (2/2)" in out
    # what a user reads in an 80-column terminal or a CI log: nothing cut, no warnings
    assert "…" not in out, out[-4000:]
    assert not [line for line in out.splitlines() if "warning" in line.lower()], out[-4000:]
    checks = 2 * len(SOURCE_CHECK_DESCRIPTIONS)  # every check of 2 partitions
    for name in ("impressions_parquet", "impressions_delta", "impressions_iceberg", "events_kafka"):
        assert re.search(rf"{name}\s.*\s{checks}/{checks}\s", out), (
            f"{name}: not every check of its 2 partitions passed"
        )
    flat = " ".join(out.split())  # titles and captions wrap at 80 columns
    assert "training asset ctr_demo_model [2026-11-02]" in flat and "next-hour AUC" in out
    assert re.search(r"MLflow run [0-9a-f]{32}", flat)
    assert (tmp_path / "home" / "mlflow" / "mlflow.db").exists()
    port = re.search(r"Kafka 127\.0\.0\.1:(\d+)", flat).group(1)
    leftovers = [
        p.info
        for p in psutil.process_iter(["pid", "cmdline"])
        if any(f"127.0.0.1:{port}" in part for part in (p.info["cmdline"] or []))
    ]
    assert leftovers == []
    assert not (tmp_path / "home" / "broker.json").exists()
    # the broker it started saved its records first: `make dev` replays them (tests/devtools/test_broker_records.py)
    saved = json.loads((tmp_path / "home" / "broker_records" / "topics.json").read_text())["topics"]
    assert sum(sum(topic["highs"].values()) for topic in saved.values()) > 0
    assert (tmp_path / "home" / "dagster_home" / "dagster.yaml").exists()

    # Runs of the location's defined jobs, recorded with the location and repository they came from: the UI
    # re-executes them (tests/dagster_defs/test_browser.py does) and shows them on the Overview timeline.
    instance = DagsterInstance.from_config(str(tmp_path / "home" / "dagster_home"))
    runs = instance.get_runs()
    by_job: dict[str, list[str]] = {}
    for run in runs:
        assert run.status == DagsterRunStatus.SUCCESS, run.run_id
        assert run.remote_job_origin is not None, f"{run.job_name}: launched without its code location"
        assert run.remote_job_origin.location_name == "definitions"
        assert run.remote_job_origin.repository_origin.repository_name == "__repository__"
        by_job.setdefault(run.job_name, []).append(run.tags["dagster/partition"])
    assert {job: sorted(keys) for job, keys in by_job.items()} == {
        "ctr_demo_files_hour_job": ["2026-11-01-00:00", "2026-11-01-01:00"],
        "ctr_demo_events_kafka_hour_job": ["2026-11-01-00:00", "2026-11-01-01:00"],
        "ctr_demo_training_job": ["2026-11-02"],
    }

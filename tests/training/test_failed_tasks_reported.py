"""Tasks given up below ``data.failed_task_threshold`` are reported where users look: the run log, the
result (and ``train --json``), MLflow (metric, artifact, incomplete dataset inputs) and the asset's
metadata; ``data.allow_failed_tasks: false`` and ``train --strict`` fail the run naming the files.

The unit tests fail tasks on a real :class:`DataDriver`; the integration test truncates one Parquet file
of a small world and runs the real ``primus-dagster train`` (executor processes, Flight, MLflow)."""

from __future__ import annotations

import doctest
import json
import logging
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import mlflow
import pytest
from dagster import MetadataValue
from jobkit import make_job, train_one_hour

import primus_dagster.dagster_defs.training_asset as training_asset
from primus_dagster.data import DataDriver, DataTask, ReadTask, TimeWindow
from primus_dagster.spec import parse_job_spec
from primus_dagster.training import failed_tasks
from primus_dagster.training.failed_tasks import (
    FAILED_TASKS_ARTIFACT,
    FAILED_TASKS_LOGGED,
    FailedTasksError,
    failed_task_rows,
    failed_tasks_allowed,
    record_failed_tasks,
)
from primus_dagster.training.modes import phases
from primus_dagster.training.planning import consumed_sources
from primus_dagster.training.progress import Heartbeat
from primus_dagster.training.result import TrainingResult
from primus_dagster.training.run_state import TrainingRequest, TrainingRun
from primus_dagster.training.tracking import MlflowTracker

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
SPEC = """
name: failed-tasks
data: {{max_attempts: 1, failed_task_threshold: 1.0{data}}}
dataset:
  start: 2026-11-01
  streams:
    - name: history
      window: 2h
      sources:
        - {{name: imp, type: parquet, kind: batch, path: pq, columns: &cols {{ts: event_time, label: click,
            id: sample_id, dense: [d0], sparse: [user_id]}}}}
    - name: live
      window: 1h
      sources:
        - {{name: clicks, type: kafka, kind: stream, topic: clicks, columns: *cols}}
"""


def file_task(hour: int, part: int) -> DataTask:
    uri = f"/data/pq/dt=2026-11-01/hour={hour:02d}/part-{part}.parquet"
    return DataTask.for_read("history", "batch", ReadTask("imp", T0 + timedelta(hours=hour), uri, rows=100))


def kafka_task() -> DataTask:
    return DataTask.for_read("live", "stream", ReadTask("clicks", T0, "clicks:3", 100, 200))


def driver_with_failures(tasks: list[DataTask], failing: set[str]) -> DataDriver:
    """A real driver that ran ``tasks``: those in ``failing`` given up (a truncated file), the rest done."""
    driver = DataDriver(max_attempts=1, failed_task_threshold=1.0)
    driver.add_tasks(tasks)
    for lease in driver.lease("exec-0", max_tasks=len(tasks)):
        task_id = lease.task.task_id
        if task_id in failing:
            driver.fail("exec-0", task_id, f"reading {lease.task.read.uri}: Parquet magic bytes not found\nin footer")
        else:
            driver.complete("exec-0", task_id, rows=100, batches=1)
    return driver


class RecordingTracker:
    """What the report sends to MLflow: metrics, JSON artifacts and dataset inputs."""

    def __init__(self) -> None:
        self.metrics: list[tuple[dict[str, float], int]] = []
        self.artifacts: dict[str, Any] = {}
        self.inputs: list[dict[str, Any]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.metrics.append((dict(metrics), step))

    def log_dict(self, data: dict[str, Any], artifact_file: str) -> None:
        self.artifacts[artifact_file] = json.loads(json.dumps(data))

    def log_source_inputs(self, sources: dict[str, Any], context: str = "training") -> int:
        self.inputs.append(json.loads(json.dumps(sources)))
        return len(sources)


def training_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tasks: list[DataTask], data: str = "") -> TrainingRun:
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    job = parse_job_spec(SPEC.format(data=data))
    request = TrainingRequest(job, tmp_path / "job.yaml", tmp_path, TimeWindow(T0, T0 + timedelta(hours=2)))
    return TrainingRun(request, cast(MlflowTracker, RecordingTracker()), tasks, Heartbeat())


def test_rows_name_the_file_or_offsets_partition_attempts_and_error() -> None:
    tasks = [file_task(0, 0), file_task(0, 1), kafka_task()]
    driver = driver_with_failures(tasks, {tasks[1].task_id, tasks[2].task_id})
    rows = failed_task_rows(driver.failure_report(), {t.task_id: t for t in tasks}, "mixed", {"clicks"})
    assert [(r["where"], r["source"], r["partition"], r["attempts"], r["failures"]) for r in rows] == [
        (tasks[1].read.uri, "imp", T0.isoformat(), 1, 1),
        ("topic clicks partition 3 offsets 100-200", "clicks", T0.isoformat(), 1, 1),
    ]
    assert rows[0]["error"].startswith(f"reading {tasks[1].read.uri}: Parquet magic bytes not found in footer (")
    assert {r["phase"] for r in rows} == {"mixed"}


def test_a_phase_report_reaches_the_log_mlflow_and_the_consumed_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = [file_task(hour, part) for hour in range(2) for part in range(15)]  # 30 tasks, 25 of them given up
    failing = {t.task_id for t in tasks[5:]}
    run = training_run(tmp_path, monkeypatch, tasks)
    tracker = cast(RecordingTracker, run.tracker)
    (phase,) = phases("batch")
    with caplog.at_level(logging.WARNING, logger="primus_dagster"):
        rows = record_failed_tasks(run, phase, driver_with_failures(tasks, failing), step=7)
    assert {r["task_id"] for r in rows} == failing and run.failed_tasks == {"batch": rows}
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    per_task = [line for line in lines if line.startswith("data task given up, phase batch: ")]
    assert len(per_task) == FAILED_TASKS_LOGGED  # capped ...
    assert f"{rows[0]['where']} (imp {rows[0]['partition']}): given up after 1 attempt(s): reading" in per_task[0]
    (count,) = [line for line in lines if "data task(s) given up" in line]  # ... plus a count
    assert "phase batch: 25 of 30 data task(s) given up" in count and "5 not listed above" in count
    assert tracker.metrics == [({"failed_tasks": 25.0}, 7)]
    assert tracker.artifacts[FAILED_TASKS_ARTIFACT] == {"failed_tasks": rows}
    # Both hours had a task given up: not consumed in full, in the run's lineage and its MLflow inputs.
    hours = [T0.isoformat(), (T0 + timedelta(hours=1)).isoformat()]
    imp = run.consumed["imp"]
    assert imp["incomplete"] is True and imp["failed_tasks"] == 25 and imp["incomplete_partitions"] == hours
    assert tracker.inputs == [{"imp": imp}]


def test_a_phase_without_failures_logs_a_zero_and_changes_no_lineage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = [file_task(0, 0), file_task(0, 1)]
    run = training_run(tmp_path, monkeypatch, tasks)
    before = json.dumps(run.consumed, sort_keys=True)
    tracker = cast(RecordingTracker, run.tracker)
    assert record_failed_tasks(run, phases("batch")[0], driver_with_failures(tasks, set()), step=3) == []
    assert tracker.metrics == [({"failed_tasks": 0.0}, 3)]
    assert tracker.artifacts == {} and tracker.inputs == []
    assert json.dumps(run.consumed, sort_keys=True) == before  # the same MLflow dataset digests as before


def test_consumed_sources_marks_only_the_partitions_of_given_up_tasks() -> None:
    job = parse_job_spec(SPEC.format(data=""))
    tasks = [file_task(0, 0), file_task(1, 0), kafka_task()]
    plain = consumed_sources(job, tasks)
    marked = consumed_sources(job, tasks, {tasks[1].task_id})
    assert marked["clicks"] == plain["clicks"]  # untouched: no incomplete keys
    assert marked["imp"] == {
        **plain["imp"],
        "incomplete": True,
        "failed_tasks": 1,
        "incomplete_partitions": [(T0 + timedelta(hours=1)).isoformat()],
    }
    assert "incomplete" not in plain["imp"]


def test_strict_and_the_spec_key_decide_whether_given_up_tasks_are_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = training_run(tmp_path, monkeypatch, [file_task(0, 0)])
    assert run.job.data.allow_failed_tasks is True  # the default
    assert failed_tasks_allowed(run.request)
    run.request.strict = True
    assert not failed_tasks_allowed(run.request)
    spec_off = training_run(tmp_path, monkeypatch, [file_task(0, 0)], data=", allow_failed_tasks: false")
    assert spec_off.job.data.allow_failed_tasks is False and not failed_tasks_allowed(spec_off.request)


def test_the_strict_error_is_one_line_naming_the_files() -> None:
    tasks = [file_task(0, part) for part in range(8)]
    driver = driver_with_failures(tasks, {t.task_id for t in tasks})
    rows = failed_task_rows(driver.failure_report(), {t.task_id: t for t in tasks}, "batch", set())
    message = str(FailedTasksError(rows, 8, "train --strict allows none"))
    assert "\n" not in message
    assert message.startswith("8 of 8 data task(s) given up and train --strict allows none: ")
    assert all(t.read.uri in message for t in tasks[:5]) and tasks[5].read.uri not in message
    assert message.endswith("; ... and 3 more")


def test_the_result_and_the_asset_metadata_carry_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = [file_task(0, 0), file_task(0, 1)]
    run = training_run(tmp_path, monkeypatch, tasks)
    rows = record_failed_tasks(run, phases("batch")[0], driver_with_failures(tasks, {tasks[1].task_id}), step=1)
    result = TrainingResult("r", "u", "m", run.request.window, {}, None, {}, consumed=run.consumed, failed_tasks=rows)
    meta = result.metadata()
    assert meta["failed_task_count"] == 1 and meta["failed_tasks"] == rows
    assert meta["incomplete_partitions"] == {"imp": [T0.isoformat()]}
    typed = training_asset.typed_metadata(meta)
    assert typed["failed_task_count"] == MetadataValue.int(1)
    assert typed["failed_tasks"] == MetadataValue.json(rows)
    table = training_asset.failed_tasks_markdown(rows)
    assert f"| {tasks[1].read.uri} | imp | {T0.isoformat()} | 1 | reading {tasks[1].read.uri}" in table


def test_the_docstring_examples_hold() -> None:
    for module in (failed_tasks, training_asset):
        assert doctest.testmod(module).failed == 0


@pytest.mark.integration
def test_a_truncated_file_is_reported_and_strict_runs_fail_naming_it(tmp_path: Path) -> None:
    # Two hours of two files each; the bad file is the window's first: the layout and dense statistics,
    # read in process from the first rows of the window, skip it with a warning (the data plane reports it).
    env = make_job(
        tmp_path, mode="batch", model="single", hours=2, rows_per_hour=300, extra_training="features: {stats_rows: 10}"
    )
    hour_00 = env["window"].start.isoformat()

    def train(*extra: str) -> subprocess.CompletedProcess[str]:
        return train_one_hour(env, "--hours", "2", "--no-eval", *extra)  # the last --hours counts

    spec = env["job_path"]
    text = spec.read_text()
    data = "data: {lease: 5s, buffer_batches: 4}"
    assert data in text
    spec.write_text(
        text.replace(data, "data: {lease: 5s, buffer_batches: 4, max_attempts: 2, failed_task_threshold: 0.6}")
    )
    bad = sorted((tmp_path / "parquet" / "impressions").rglob("hour=00/*.parquet"))[0]  # 1 of the window's 4 files
    content = bad.read_bytes()
    bad.write_bytes(content[: len(content) // 2])  # the footer is gone

    done = train("--json")
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line and "given up" in line]
    assert any(f"data task given up, phase batch: {bad} (imp " in line for line in warnings), done.stderr[-3000:]
    assert any("1 of 4 data task(s) given up" in line for line in warnings)
    assert f"features: {bad} could not be read" in done.stderr  # left out of the statistics, no traceback
    assert "Traceback" not in done.stderr
    meta = json.loads(done.stdout.strip().splitlines()[-1])
    assert meta["failed_task_count"] == 1
    (row,) = meta["failed_tasks"]
    assert row["where"] == str(bad) and row["attempts"] == 2 and row["source"] == "imp" and row["error"]
    assert meta["incomplete_partitions"] == {"imp": [hour_00]}
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    run = client.get_run(meta["mlflow_run_id"])
    assert run.data.metrics["failed_tasks"] == 1.0
    artifact = Path(client.download_artifacts(run.info.run_id, FAILED_TASKS_ARTIFACT, str(tmp_path)))
    assert [r["where"] for r in json.loads(artifact.read_text())["failed_tasks"]] == [str(bad)]
    incomplete = [d for d in run.inputs.dataset_inputs if {t.key: t.value for t in d.tags}.get("primus.incomplete")]
    assert [json.loads(d.dataset.source)["incomplete_partitions"] for d in incomplete] == [[hour_00]]

    strict = train("--strict", "--run-key", "strict-flag")
    spec.write_text(
        spec.read_text().replace("failed_task_threshold: 0.6", "failed_task_threshold: 0.6, allow_failed_tasks: false")
    )
    spec_off = train("--run-key", "strict-spec")
    for failed, why in ((strict, "train --strict allows none"), (spec_off, "data.allow_failed_tasks is false")):
        assert failed.returncode == 1, failed.stderr[-3000:]
        (error,) = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
        assert f"given up and {why}: {bad} (imp " in error, error
    failed_runs = client.search_runs(
        [run.info.experiment_id], filter_string="attributes.status = 'FAILED'", max_results=10
    )
    assert sorted(r.data.metrics.get("failed_tasks") for r in failed_runs) == [1.0, 1.0]  # reported there too


def test_train_strict_reaches_the_request_and_fails_with_one_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``train --strict`` (training faked): the request is strict, the error is exit 1 and one line."""
    from primus_dagster.cli import main
    from primus_dagster.training import tracking, window

    seen: list[bool] = []

    def fake_train_window(request: TrainingRequest, hooks: object) -> TrainingResult:
        seen.append(request.strict)
        rows = [{"where": "/data/a.parquet", "attempts": 2, "error": "Parquet magic bytes not found"}]
        raise FailedTasksError(rows, 4, "train --strict allows none")

    monkeypatch.setattr(window, "train_window", fake_train_window)
    monkeypatch.setattr(tracking, "MlflowTracker", lambda *args, **kwargs: None)
    example = str(Path(__file__).resolve().parents[2] / "examples" / "job.yaml")
    assert main(["train", example, "--hours", "1", "--strict"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: 1 of 4 data task(s) given up and train --strict allows none: "
        "/data/a.parquet: given up after 2 attempt(s): Parquet magic bytes not found"
    ]
    assert main(["train", example, "--hours", "1"]) == 1 and seen == [True, False]

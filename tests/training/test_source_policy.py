"""No source lost in silence: a source the mode trains that cannot be read fails the run (never a run on
the other sources alone); partitions not ready inside the window are skipped with a warning and listed
in the result, its metadata and an MLflow tag, and so are ready partitions without a row."""

from __future__ import annotations

import logging
import shutil
from datetime import timedelta
from pathlib import Path

import mlflow
import pyarrow.parquet as pq
import pytest
from jobkit import make_job

from primus_dagster.data import TimeWindow
from primus_dagster.ports import free_port
from primus_dagster.spec import load_job_spec
from primus_dagster.synth import SyntheticWorld, WorldConfig, write_world
from primus_dagster.training.planning import NO_ROWS, NOTHING_TO_READ, IncompleteWindowError, SourceUnavailableError
from primus_dagster.training.run_state import TrainingRequest
from primus_dagster.training.window import train_window


def test_an_unreachable_stream_source_fails_the_run_naming_it(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    env = make_job(tmp_path, hours=0, kafka=dead, topic="nowhere")
    world = SyntheticWorld(WorldConfig(seed=5, rows_per_hour=300, n_dense=5), env["job"].dataset.start)
    write_world(env["job"], env["context"], world, range(3), sources=["imp"], progress=False)
    window = env["job"].dataset.start, env["job"].dataset.start + timedelta(hours=2)
    cfg = TrainingRequest(env["job"], env["job_path"], env["root"], TimeWindow(*window), kafka_bootstrap=dead)
    with pytest.raises(SourceUnavailableError, match=r"cannot read source\(s\) \['events'\].*no Kafka broker answers"):
        train_window(cfg)
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    assert not client.search_experiments() or not client.search_runs(
        [e.experiment_id for e in client.search_experiments()]
    )  # refused before a run was started


@pytest.mark.integration
def test_not_ready_and_empty_hours_inside_the_window_are_named_loudly(tmp_path: Path, caplog) -> None:
    """Hour 1 of the stream is not ready (no folder): skipped. Hour 2 of the stream is ready with nothing to
    read (its `_SUCCESS`, no data file; `allow_empty: true`), hour 0 of the batch source holds a file without rows: both named as
    empty in the run log, the result, its metadata and an MLflow tag; the run trains the rest."""
    env = make_job(tmp_path, hours=3, rows_per_hour=400)
    spec = env["job_path"].read_text().replace("path: parquet/events,", "path: parquet/events, allow_empty: true,")
    env["job_path"].write_text(spec)  # an empty hour is expected of this stream (else it fails the run)
    job = load_job_spec(env["job_path"])
    start = job.dataset.start
    hour = start + timedelta(hours=1)
    shutil.rmtree(tmp_path / "parquet" / "events" / f"dt={hour:%Y-%m-%d}" / f"hour={hour:%H}")
    nothing = start + timedelta(hours=2)
    for path in (tmp_path / "parquet" / "events" / f"dt={nothing:%Y-%m-%d}" / f"hour={nothing:%H}").glob("*.parquet"):
        path.unlink()
    for path in (tmp_path / "parquet" / "impressions" / f"dt={start:%Y-%m-%d}" / "hour=00").glob("*.parquet"):
        pq.write_table(pq.read_table(path).slice(0, 0), path)  # the schema, no row
    with caplog.at_level(logging.WARNING, logger="primus_dagster"):
        result = train_window(
            TrainingRequest(job, env["job_path"], env["root"], env["window"], executors=1, evaluate=False)
        )
    assert [(s["source"], s["partition"]) for s in result.skipped_partitions] == [("events", hour.isoformat())]
    assert result.metadata()["skipped_partitions"] == result.skipped_partitions
    assert "1 partition(s) inside the window are not ready and are skipped: events" in caplog.text
    assert result.empty_partitions == [
        {"source": "events", "partition": nothing.isoformat(), "reason": NOTHING_TO_READ},
        {"source": "imp", "partition": start.isoformat(), "reason": NO_ROWS},
    ]
    assert result.metadata()["empty_partitions"] == result.empty_partitions
    assert f"1 ready partition(s) of the window hold nothing to read: events {nothing:%Y-%m-%dT%H:%M}" in caplog.text
    assert f"1 partition(s) held no rows: imp {start:%Y-%m-%dT%H:%M}" in caplog.text
    assert result.stats["samples"] > 0
    tags = mlflow.MlflowClient(job.tracking.tracking_uri).get_run(result.run_id).data.tags
    assert tags["primus.skipped_partitions"] == f"events {hour:%Y-%m-%dT%H:%M}"
    assert tags["primus.empty_partitions"] == f"events {nothing:%Y-%m-%dT%H:%M}, imp {start:%Y-%m-%dT%H:%M}"


@pytest.mark.integration
def test_a_run_asked_for_the_whole_window_fails_before_it_starts_naming_the_hour(tmp_path: Path) -> None:
    """``complete_window`` (the training asset, ``train --strict``): a not-ready hour inside the window
    fails the run before an MLflow run or an executor starts, naming the source and hour."""
    env = make_job(tmp_path, hours=3, rows_per_hour=400)
    hour = env["job"].dataset.start + timedelta(hours=1)
    shutil.rmtree(tmp_path / "parquet" / "events" / f"dt={hour:%Y-%m-%d}" / f"hour={hour:%H}")
    request = TrainingRequest(
        env["job"], env["job_path"], env["root"], env["window"], executors=1, evaluate=False, complete_window=True
    )
    with pytest.raises(IncompleteWindowError, match=rf"1 partition\(s\) not ready: events {hour:%Y-%m-%dT%H:%M} \("):
        train_window(request)
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    experiments = client.search_experiments()
    assert not experiments or not client.search_runs([e.experiment_id for e in experiments])

"""Data-quality counts of a training run: a Parquet file with NaN/inf dense values, null labels and an
out-of-partition event time goes through the real data plane (executor processes, Flight, the driver);
the counts arrive in the job result, its Dagster metadata, MLflow and the run log."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobkit import make_job

from primus_dagster.data import QUALITY_RULES, Batch
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.window import train_window

pytestmark = pytest.mark.integration


def spoil(path: Path) -> None:
    """Dense NaN in row 0 and +inf in row 1 (d2), null labels in rows 2-4, row 5 one hour late, a fractional
    item id in row 6 (the column written as floats, as a team's export may)."""
    table = pq.read_table(path)
    d2 = table.column("d2").to_numpy().copy()
    d2[0], d2[1] = np.nan, np.inf
    click = table.column("click").to_pylist()
    click[2:5] = [None] * 3
    ts = table.column("event_time").to_pylist()
    ts[5] += timedelta(hours=1)
    item = table.column("item_id").to_numpy().astype(np.float64)
    item[6] = 2.5
    spoiled = {"d2": pa.array(d2), "click": pa.array(click, pa.int32()), "event_time": pa.array(ts)}
    for name, values in {**spoiled, "item_id": pa.array(item)}.items():
        table = table.set_column(table.schema.get_field_index(name), name, values)
    pq.write_table(table, path)


def test_quality_counts_reach_result_metadata_mlflow_and_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = make_job(tmp_path, mode="batch", model="single", hours=1, rows_per_hour=300)
    bad = sorted((tmp_path / "parquet" / "impressions").rglob("hour=00/*.parquet"))[0]
    spoil(bad)
    job = env["job"].model_copy(update={"owners": ["team:recsys"], "tags": {"domain": "ads"}})
    with caplog.at_level(logging.WARNING, logger="primus_dagster"):
        result = train_window(
            TrainingRequest(job, env["job_path"], env["root"], env["window"], executors=1, evaluate=False)
        )
    expected = {"bad_id": 1, "dense_invalid": 2, "null_label": 3, "ts_outside_partition": 1}
    assert result.data_quality == {"imp": expected}
    meta = result.metadata()
    assert meta["data_quality"] == {"imp": expected} and meta["data_quality_rows"] == 7
    rows = sum(pq.read_metadata(f).num_rows for f in bad.parent.glob("*.parquet"))
    assert result.stats["samples"] == rows - 3  # the batch source's null labels are dropped
    run = mlflow.MlflowClient(env["job"].tracking.tracking_uri).get_run(result.run_id)
    assert run.data.tags["domain"] == "ads" and run.data.tags["primus.owners"] == "team:recsys"  # the spec's
    metrics = run.data.metrics
    # every rule of the source the batch phase read, zeros included ("0 repaired" is measured, not missing)
    assert {k: v for k, v in metrics.items() if k.startswith("data_quality.")} == {
        f"data_quality.imp.{rule}": float(expected.get(rule, 0)) for rule in QUALITY_RULES
    }
    line = next(r.getMessage() for r in caplog.records if "data quality" in r.getMessage())
    assert (
        "imp: 1 row bad_id" in line
        and "2 rows dense_invalid in column d2 (repaired: NaN, +-inf or null dense values -> missing, the feature's fill"
        in line
    )
    assert "3 rows null_label in column click (dropped)" in line
    assert "1 row bad_id in column item_id (repaired: sparse id -> 0" in line  # each repair names its column
    assert f"dense_invalid in {bad}: 2 rows" in line  # the file is named
    assert meta["data_quality_where"] == {"imp": {rule: [f"{bad}: {n} rows"] for rule, n in expected.items()}}


class KilledInStream(RuntimeError):
    """The process 'dies' in the stream phase, after a checkpoint of that phase."""


def test_quality_counts_of_a_finished_phase_survive_a_resume(tmp_path: Path) -> None:
    """Killed in its stream phase and resumed, the run still reports the batch phase's counts (kept in the
    checkpoint), and the stream phase's once: the same totals as an uninterrupted run."""
    env = make_job(tmp_path, mode="batch_then_stream", model="single", every=3, hours=1, rows_per_hour=3000)
    spoiled = [
        sorted((tmp_path / "parquet" / name).rglob("hour=00/*.parquet"))[0] for name in ("impressions", "events")
    ]
    for path in spoiled:
        table = pq.read_table(path)
        d2 = table.column("d2").to_numpy().copy()
        d2[0], d2[1] = np.nan, -np.inf
        pq.write_table(table.set_column(table.schema.get_field_index("d2"), "d2", pa.array(d2)), path)
    cfg = TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=1, evaluate=False)
    first_stream_step: list[int] = []

    def die_in_stream(step: int, batch: Batch, trainer: int) -> None:
        if batch.kind == "stream":
            first_stream_step[:] = first_stream_step or [step]
            if step > first_stream_step[0] + 3:  # past the stream phase's first checkpoint (every 3 steps)
                raise KilledInStream(f"killed at step {step}")

    with pytest.raises(KilledInStream):
        train_window(cfg, RunHooks(on_batch=die_in_stream))
    result = train_window(cfg)
    assert result.resumed_from_step is not None and result.resumed_from_step >= first_stream_step[0]
    expected = {"imp": {"dense_invalid": 2}, "events": {"dense_invalid": 2}}
    assert result.data_quality == expected
    assert result.metadata()["data_quality_where"] == {
        name: {"dense_invalid": [f"{path}: 2 rows"]} for name, path in zip(("imp", "events"), spoiled, strict=True)
    }

"""The reference deployment's training asset through ``dagster asset materialize`` (embedded
defaults: SQLite Dagster instance, MLflow on SQLite under ``$PRIMUS_HOME``, local executor
processes, the embedded Kafka-compatible broker), then the model back from MLflow. The spec is the
reference one with hourly training partitions (``locationkit.hourly_reference_spec``): the same code
paths on an hour of data (the daily partitions: `make demo`; the UI's backfill: tests/devtools/test_demo.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from locationkit import REPO, hourly_reference_spec, materialize_cli, reference_env

pytestmark = pytest.mark.integration

READ_BACK = """
import json, sys
import mlflow, torch
from dagster import AssetKey, DagsterInstance
from primus_dagster.data import Planner, SourceContext, TimeWindow, arrow_to_tensors, make_adapter
from primus_dagster.spec import load_job_spec
from primus_dagster.training.tracking import default_tracking_uri, use_tracking_uri

event = DagsterInstance.get().get_latest_materialization_event(AssetKey("ctr_demo_model"))
meta = {k: getattr(v, "value", None) for k, v in event.asset_materialization.metadata.items()
        if k != "dagster/column_schema"}  # a TableSchema is not JSON
client = mlflow.MlflowClient(default_tracking_uri())
checkpoints = [a.path for a in client.list_artifacts(meta["mlflow_run_id"], "checkpoints")]
with use_tracking_uri(default_tracking_uri()):
    model = mlflow.pytorch.load_model(meta["model_uri"])
job = load_job_spec("examples/job.yaml")
context = SourceContext(sys.argv[1])
with Planner.for_job(job, context) as planner:
    task = next(iter(planner.plan(TimeWindow.hours_from(job.dataset.start, 1)).tasks))
with make_adapter(job.dataset.source(task.read.source), context) as adapter:
    tensors = arrow_to_tensors(next(iter(adapter.read(task.read))))
with torch.no_grad():
    scores = torch.sigmoid(model.predict(torch.nan_to_num(tensors.dense, nan=0.0), tensors.sparse))
print(json.dumps({"meta": meta, "checkpoints": checkpoints, "scored": int(scores.numel()),
                  "in_range": bool(((scores > 0) & (scores < 1)).all())}, default=str))
"""


def test_dagster_asset_materialize_trains_and_mlflow_holds_a_loadable_model(tmp_path: Path, own_kafka_broker) -> None:
    # A day and three hours: the batch hour a day before (lagged 24 h), the stream hour, an evaluation hour,
    # and one more hour so the stream has moved past the evaluation hour.
    env = reference_env(
        tmp_path / "primus_home",
        own_kafka_broker.bootstrap_servers,
        hours=27,
        rows_per_hour=150,
        timeout=400,
        spec=hourly_reference_spec(tmp_path),
    )
    proc = materialize_cli(env, "ctr_demo_model", "2026-11-02-00:00", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = subprocess.run(
        [sys.executable, "-c", READ_BACK, env["PRIMUS_DATA_ROOT"]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    meta = got["meta"]
    assert meta["samples"] > 0 and meta["window_start"].startswith("2026-11-02")
    assert 0.0 <= meta["eval_auc"] <= 1.0 and meta["eval_labels"] == "batch"
    assert "events_kafka" in meta["source_versions"] and "impressions_delta" in meta["source_versions"]
    assert got["checkpoints"], "the MLflow run holds no checkpoint"
    assert got["scored"] > 0 and got["in_range"]

"""The window skeleton (``train_window``) end to end: real executor processes, Flight, the driver, MLflow (SQLite).

The kill test SIGKILLs a running ``primus-dagster train`` (with its executors: the whole process
group, as when a node dies), restarts it, and checks through the log of trained sample ids that it resumed
from the MLflow checkpoint and trained every sample of the window exactly once after it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import mlflow
import pytest
import torch
from jobkit import expected_ids, kill_at_first_checkpoint, make_job, resume_and_count

from primus_dagster.data import Batch
from primus_dagster.data.graph import Planner
from primus_dagster.data.sources import make_adapter
from primus_dagster.devtools.trained_sample_ids import TrainedSampleIdsLog, read_trained_sample_ids
from primus_dagster.training.checkpoint import checkpoint_files, checkpoint_name
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.tracking import MlflowTracker, use_tracking_uri
from primus_dagster.training.window import train_window

pytestmark = pytest.mark.integration


def test_mixed_mtrm_job_checkpoints_evaluates_and_logs_a_loadable_model(tmp_path: Path) -> None:
    env = make_job(tmp_path, mode="mixed", model="mtrm", every=5)
    phases = []
    with TrainedSampleIdsLog(tmp_path / "samples.bin") as samples:
        result = train_window(
            TrainingRequest(
                env["job"],
                env["job_path"],
                env["root"],
                env["window"],
                executors=2,
                progress=lambda p: phases.append(p["phase"]),
            ),
            RunHooks(on_batch=lambda step, batch, trainer: samples.append(step, batch.sample_id)),
        )
    expected = expected_ids(env)
    trained = Counter(int(i) for _, ids in read_trained_sample_ids(tmp_path / "samples.bin") for i in ids)
    assert trained == expected
    assert result.stats["samples"] == sum(expected.values())
    assert result.stats["samples_batch"] > 0 and result.stats["samples_stream"] > 0
    assert set(phases) == {"mixed"}
    assert result.checkpoints and result.checkpoints[-1] == result.stats["step"]
    assert result.evaluation is not None and result.evaluation.labels == "batch"
    assert 0.0 <= result.evaluation.result.auc <= 1.0 and result.evaluation.result.rows > 0  # quality: bench/quality.py
    meta = result.metadata()
    assert meta["eval_auc"] == result.evaluation.result.auc and meta["mlflow_run_id"] == result.run_id

    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert {"loss", "samples_per_s", "eval_auc"} <= set(run.data.metrics)
    losses = client.get_metric_history(result.run_id, "loss")  # every step's loss, not a timer's samples
    assert sorted(m.step for m in losses) == list(range(1, result.stats["step"] + 1))
    assert [a.path for a in client.list_artifacts(result.run_id, "checkpoints")]
    with use_tracking_uri(env["job"].tracking.tracking_uri):
        model = mlflow.pytorch.load_model(result.model_uri)
    batch = Batch.from_arrow(next(iter(_some_batch(env))))
    with torch.no_grad():
        scores = torch.sigmoid(model.predict(batch.dense, batch.sparse))
    assert scores.shape == (batch.rows,) and bool(((scores > 0) & (scores < 1)).all())


def _some_batch(env: dict):
    task = next(iter(Planner(env["job"].dataset, env["context"], threads=1).plan(env["window"]).tasks))
    with make_adapter(env["job"].dataset.source(task.read.source), env["context"]) as adapter:
        yield from adapter.read(task.read)


def test_batch_then_stream_pretrains_on_the_batch_window_then_follows_the_stream(tmp_path: Path) -> None:
    env = make_job(tmp_path, mode="batch_then_stream", model="mtrm", every=1000)
    phases: list[str] = []
    result = train_window(
        TrainingRequest(
            env["job"],
            env["job_path"],
            env["root"],
            env["window"],
            executors=1,
            evaluate=False,
            progress=lambda p: phases.append(p["phase"]),
        )
    )
    assert phases == sorted(phases)  # "batch" ... then "stream" ...
    assert phases[0] == "batch" and phases[-1] == "stream"
    assert result.evaluation is None
    assert len(result.checkpoints) == 2  # the end of each phase


def test_sigkill_mid_window_resumes_from_the_mlflow_checkpoint_exactly_once(tmp_path: Path, kafka_broker) -> None:
    env = make_job(
        tmp_path,
        mode="mixed",
        model="mtrm",
        every=8,
        kafka=kafka_broker.bootstrap_servers,
        topic="train-kill",
        rows_per_hour=6000,
    )
    kill_at_first_checkpoint(env, tmp_path / "run1.bin", slow_executors_ms=40)
    meta, kept, after = resume_and_count(env, tmp_path / "run1.bin", tmp_path / "run2.bin", 40, timeout_s=240)
    expected = expected_ids(env)
    assert kept + after == expected  # the checkpoint's samples once, the rest once after the restart
    assert len(set(kept) | set(after)) == len(set(expected))
    assert meta["samples"] == sum(expected.values())


class TornUpload(RuntimeError):
    """The process 'dies' while a checkpoint is uploaded."""


class TearingTracker(MlflowTracker):
    """Uploads the ``tear_at``-th checkpoint only in part (no manifest), then fails: a kill mid-upload."""

    def __init__(self, uri: str, experiment: str, tear_at: int) -> None:
        super().__init__(uri, experiment)
        self.tear_at, self.uploads, self.torn_step = tear_at, 0, -1

    def log_checkpoint(self, directory, step: int, keep_last: int | None = None) -> str:  # type: ignore[no-untyped-def]
        self.uploads += 1
        if self.uploads < self.tear_at:
            return super().log_checkpoint(directory, step, keep_last)
        model_file = checkpoint_files(directory)[0]
        self.client.log_artifact(self.require_run_id(), str(model_file), f"checkpoints/{checkpoint_name(step)}")
        self.torn_step = step
        raise TornUpload(f"killed while uploading the checkpoint at step {step}")


def test_a_torn_checkpoint_upload_resumes_from_the_previous_one_exactly_once(tmp_path: Path) -> None:
    env = make_job(tmp_path, mode="mixed", model="single", every=5, extra_training="checkpoint_keep_last: 2")
    uri, exp = env["job"].tracking.tracking_uri, env["job"].tracking.experiment
    cfg = TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=2, evaluate=False)
    tearing = TearingTracker(uri, exp, tear_at=2)
    with TrainedSampleIdsLog(tmp_path / "run1.bin") as samples, pytest.raises(TornUpload):
        train_window(
            replace(cfg, tracker=tearing),
            RunHooks(on_batch=lambda step, batch, trainer: samples.append(step, batch.sample_id)),
        )
    with TrainedSampleIdsLog(tmp_path / "run2.bin") as samples:
        result = train_window(
            replace(cfg, tracker=MlflowTracker(uri, exp)),
            RunHooks(on_batch=lambda step, batch, trainer: samples.append(step, batch.sample_id)),
        )
    resumed = result.resumed_from_step
    assert resumed is not None and 5 <= resumed < tearing.torn_step  # the complete one before the torn one
    before = list(read_trained_sample_ids(tmp_path / "run1.bin"))
    assert max(step for step, _ in before) >= tearing.torn_step  # work after it was thrown away and redone
    kept = Counter(int(i) for s, ids in before if s <= resumed for i in ids)
    after = Counter(int(i) for _, ids in read_trained_sample_ids(tmp_path / "run2.bin") for i in ids)
    assert kept + after == expected_ids(env)  # every sample once
    client = mlflow.MlflowClient(uri)
    kept_checkpoints = [a.path for a in client.list_artifacts(result.run_id, "checkpoints")]
    assert len(kept_checkpoints) == 2  # training.checkpoint_keep_last: disk per partition bounded
    assert kept_checkpoints[-1].endswith(checkpoint_name(result.stats["step"]))  # the final one is kept
    assert len(result.checkpoints) > 2

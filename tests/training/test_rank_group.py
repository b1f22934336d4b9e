"""Training jobs with ``pools.training.replicas: 2`` (``primus_dagster.training.rank_group``).

Through ``train_window``: every sample trained exactly once across the ranks (the multiset of
sample ids the ranks hand to ``on_batch``), checkpoints in MLflow, identical replicas. SIGKILL of the
``primus-dagster-dev train`` process group after a checkpoint, then the same command: it resumes and
the two attempts together train each sample once. A rank that raises fails the job with its message
and leaves no process behind; with ``restart: on_failure`` the group starts again from its checkpoint.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from pathlib import Path

import mlflow
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobkit import expected_ids, kill_at_first_checkpoint, make_job, resume_and_count
from rankkit import fail_at

from primus_dagster.spec import load_job_spec
from primus_dagster.training.phase_trainer import TrainerFailedError
from primus_dagster.training.run_state import RunHooks, TrainingRequest
from primus_dagster.training.window import train_window

pytestmark = pytest.mark.integration


def _two_trainers(env: dict, pool: str = "replicas: 2") -> dict:
    text = env["job_path"].read_text()
    assert text.count("training: {replicas: 1}") == 1
    env["job_path"].write_text(text.replace("training: {replicas: 1}", f"training: {{{pool}}}"))
    env["job"] = load_job_spec(env["job_path"])
    return env


def test_two_trainers_train_every_sample_once_with_checkpoints(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # adapt_batch_weight: a batch rank's adapt gradients ride in its message (replicas stay equal: checksum)
    model = "{type: mtrm, embedding_dim: 8, hash_buckets: 4096, memory_hidden: [16], adapt_hidden: [32, 16], "
    env = _two_trainers(make_job(tmp_path, mode="mixed", every=5, model_block=model + "adapt_batch_weight: 0.25}"))
    bad = sorted((tmp_path / "parquet" / "impressions").rglob("*.parquet"))[0]
    table = pq.read_table(bad)
    d2 = table.column("d2").to_numpy().copy()
    d2[:2] = [np.nan, np.inf]  # dense_invalid: repaired (rows kept), counted
    pq.write_table(table.set_column(table.schema.get_field_index("d2"), "d2", pa.array(d2)), bad)
    trained: Counter = Counter()
    steps: list[int] = []

    def on_batch(step: int, batch, trainer: int) -> None:
        trained.update(batch.sample_id.tolist())
        steps.append(step)

    with caplog.at_level(logging.INFO, logger="primus_dagster"):
        result = train_window(
            TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=2),
            RunHooks(on_batch=on_batch),
        )
    expected = expected_ids(env)
    assert trained == expected  # each sample exactly once across the two ranks
    assert result.stats["samples"] == sum(expected.values()) and result.stats["trainers"] == 2
    ranks = result.stats["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["samples"] > 0 for r in ranks)
    assert ranks[0]["params_checksum"] and ranks[0]["params_checksum"] == ranks[1]["params_checksum"]
    assert sum(r["samples"] for r in ranks) == result.stats["samples"]
    assert ranks[0]["exchange_bytes_per_step"] > 0
    assert len(result.checkpoints) >= 3 and result.checkpoints[-1] == result.stats["step"] == max(steps)
    assert result.evaluation is not None and result.model_uri
    client = mlflow.MlflowClient(env["job"].tracking.tracking_uri)
    logged = [a.path for a in client.list_artifacts(result.run_id, "checkpoints")]
    assert len(logged) == min(len(set(result.checkpoints)), env["job"].training.checkpoint_keep_last)  # retention
    run = client.get_run(result.run_id)
    assert run.data.params["trainers"] == "2"
    # as one trainer's job: stage lines, the consumed sources as dataset inputs, data-quality counts
    lines = [r.getMessage() for r in caplog.records]
    for stage in ("planning window", "planned ", "MLflow: opening the run", "logging the model to MLflow"):
        assert any(line.startswith(stage) for line in lines), stage
    assert any("data executors up; starting 2 trainer rank(s)" in line for line in lines)
    assert any("training (first step of rank" in line for line in lines)
    assert sorted(d.dataset.name for d in run.inputs.dataset_inputs) == sorted(result.consumed) == ["events", "imp"]
    assert result.data_quality == {"imp": {"dense_invalid": 2}}
    assert run.data.metrics["data_quality.imp.dense_invalid"] == 2.0
    assert run.data.metrics["samples"] == result.stats["samples"]  # the final count, as one trainer logs it
    assert "data_replicas" in run.data.metrics  # the data pool's timeline


def test_sigkill_mid_window_then_the_same_command_resumes_exactly_once(tmp_path: Path) -> None:
    env = _two_trainers(make_job(tmp_path, mode="mixed", model="mtrm", every=6))
    kill_at_first_checkpoint(env, tmp_path / "run1.bin", slow_executors_ms=30)
    meta, kept, after = resume_and_count(env, tmp_path / "run1.bin", tmp_path / "run2.bin", slow_executors_ms=30)
    expected = expected_ids(env)
    assert kept and after
    assert kept + after == expected  # the checkpoint's samples once, the rest once after the restart
    assert meta["samples"] == sum(expected.values())


def _children() -> set[int]:
    return {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())
    }


def test_a_failing_rank_fails_the_job_with_its_error_and_leaves_no_process(tmp_path: Path) -> None:
    env = _two_trainers(
        make_job(tmp_path, mode="mixed", model="single", every=4, hours=1), "replicas: 2, restart: never"
    )
    before = _children()
    cfg = TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=1, evaluate=False)
    with pytest.raises(TrainerFailedError, match=r"trainer rank 1 failed[\s\S]*injected failure of rank 1 at round 3"):
        train_window(cfg, RunHooks(rank_hook=functools.partial(fail_at, 1, 3, None)))
    deadline = time.monotonic() + 10
    while _children() - before and time.monotonic() < deadline:
        time.sleep(0.2)  # reaped processes may take a moment to disappear
    assert not (_children() - before)
    run = mlflow.MlflowClient(env["job"].tracking.tracking_uri).search_runs(
        [mlflow.MlflowClient(env["job"].tracking.tracking_uri).get_experiment_by_name("train-test").experiment_id]
    )[0]
    assert run.info.status == "FAILED"


def test_restart_on_failure_continues_the_group_from_its_checkpoint(tmp_path: Path) -> None:
    env = _two_trainers(
        make_job(tmp_path, mode="mixed", model="single", every=3, hours=1), "replicas: 2, max_restarts: 1"
    )
    trained: Counter = Counter()
    cfg = TrainingRequest(env["job"], env["job_path"], env["root"], env["window"], executors=1, evaluate=False)
    result = train_window(
        cfg,
        RunHooks(
            on_batch=lambda step, batch, trainer: trained.update(batch.sample_id.tolist()),
            # round 7: after the first checkpoint (due at round 3; mixed mode's drain trains each kind's
            # open micro-batch first, up to 2 more rounds), before the last
            rank_hook=functools.partial(fail_at, 0, 7, str(tmp_path / "failed-once")),
        ),
    )
    expected = expected_ids(env)
    assert (tmp_path / "failed-once").exists()
    assert result.stats["samples"] == sum(expected.values())  # counters from the checkpoint on
    assert set(trained) == set(expected) and all(trained[i] >= 1 for i in expected)  # after it: trained again
    assert result.checkpoints[0] < 7 < result.checkpoints[-1]

"""Training jobs refuse what cannot work with errors that say why: a warm start from a model that
does not fit, a window without ready data."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from jobkit import make_job

from primus_dagster.data.sources import TimeWindow
from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.checkpoint import Checkpoint
from primus_dagster.training.features import FeatureLayout, ModelInit
from primus_dagster.training.models import build_model
from primus_dagster.training.progress import Heartbeat
from primus_dagster.training.run_state import RunHooks, TrainingRequest, TrainingRun
from primus_dagster.training.single_trainer import SingleTrainer


def test_warm_start_from_an_incompatible_model_names_the_run_key(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))  # the run's scratch folder goes there
    env = make_job(tmp_path, hours=0)
    window = TimeWindow(datetime(2026, 11, 2, tzinfo=timezone.utc), datetime(2026, 11, 3, tzinfo=timezone.utc))
    cfg = TrainingRequest(env["job"], env["job_path"], tmp_path, window, warm_start="train-test/2026-11-01")
    # a tracker stand-in: no MLflow needed
    run = TrainingRun(cfg, SimpleNamespace(set_tags=lambda tags: None), [], Heartbeat())
    other = build_model(ModelSpec(type="mtrm", embedding_dim=4, hash_buckets=64), n_dense=3, n_sparse=2)
    run.warm = Checkpoint(step=7, samples=70, model_state=other.state_dict(), optimizer_state={})
    run.model_init = ModelInit(FeatureLayout.plain(env["job"].training.model, n_dense=5, n_sparse=3))
    trainer = SingleTrainer(RunHooks())
    trainer.begin(run, resume=None)
    with pytest.raises(ValueError, match="cannot warm-start from run key 'train-test/2026-11-01'"):
        trainer.build(run)


def test_a_window_without_ready_data_is_a_clear_error(tmp_path) -> None:
    from primus_dagster.data.sources import SourceContext
    from primus_dagster.training.planning import NoTrainingDataError, plan_training_tasks

    job = make_job(tmp_path, hours=0, extra_training="batch_lag: 2h")["job"]  # nothing written
    window = TimeWindow(datetime(2026, 11, 1, 5, tzinfo=timezone.utc), datetime(2026, 11, 1, 6, tzinfo=timezone.utc))
    # Only what the window needs is named: the stream hour, and the batch hour two hours back.
    expected = r"no ready data in window .* \(batch lag 2:00:00; events 2026-11-01T05:.*; imp 2026-11-01T03:[^;]*\)$"
    with pytest.raises(NoTrainingDataError, match=expected):
        plan_training_tasks(job, SourceContext(str(tmp_path)), window)

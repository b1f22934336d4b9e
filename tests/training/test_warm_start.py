"""Training jobs refuse what cannot work with errors that say why: a warm start from a model that
does not fit or from a run that never finished, a tracking URI MLflow has no store for, a window without
ready data."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest
from jobkit import make_job

from primus_dagster.data.sources import TimeWindow
from primus_dagster.spec.job import ModelSpec
from primus_dagster.training.checkpoint import Checkpoint, save_checkpoint
from primus_dagster.training.features import FeatureLayout, ModelInit
from primus_dagster.training.loop import PhaseContext, PhaseLoop, Solo, TrainerStart
from primus_dagster.training.models import build_model


def test_warm_start_from_an_incompatible_model_names_the_run_key(tmp_path) -> None:
    env = make_job(tmp_path, hours=0)
    spec = env["job"].training
    other = build_model(ModelSpec(type="mtrm", embedding_dim=4, hash_buckets=64), n_dense=3, n_sparse=2)
    warm = save_checkpoint(
        Checkpoint(step=7, samples=70, model_state=other.state_dict(), optimizer_state={}), tmp_path / "warm"
    )
    init = ModelInit(FeatureLayout.plain(spec.model, n_dense=5, n_sparse=3))
    start = TrainerStart(str(warm), "warm", warm_key="train-test/2026-11-01")
    context = dataclasses.replace(PhaseContext.outside_run(spec, world=1, init=init), start=start)
    loop = PhaseLoop(context, Solo(), reader=None, sink=None)  # type: ignore[arg-type]  # it fails building
    with pytest.raises(ValueError, match="cannot warm-start from run key 'train-test/2026-11-01'"):
        loop.finish()  # builds the model from its start: the warm start


def test_a_window_without_ready_data_is_a_clear_error(tmp_path) -> None:
    from primus_dagster.data.sources import SourceContext
    from primus_dagster.training.planning import NoTrainingDataError, plan_training_tasks

    job = make_job(tmp_path, hours=0, extra_training="batch_lag: 2h")["job"]  # nothing written
    window = TimeWindow(datetime(2026, 11, 1, 5, tzinfo=timezone.utc), datetime(2026, 11, 1, 6, tzinfo=timezone.utc))
    # Only what the window needs is named: the stream hour, and the batch hour two hours back.
    expected = r"no ready data in window .* \(batch lag 2:00:00; events 2026-11-01T05:.*; imp 2026-11-01T03:[^;]*\)$"
    with pytest.raises(NoTrainingDataError, match=expected):
        plan_training_tasks(job, SourceContext(str(tmp_path)), window)


def test_train_from_a_missing_run_or_a_bogus_tracking_uri_is_one_line(tmp_path, capsys) -> None:
    from primus_dagster.cli import main

    env = make_job(tmp_path, hours=1)
    train = ["train", str(env["job_path"]), "--start", "2026-11-01", "--hours", "1", "--data-root", str(tmp_path)]
    assert main([*train, "--warm-start", "train-test/nosuchrun"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "no finished run 'train-test/nosuchrun'" in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.strip().splitlines()[-1]]
    assert main([*train, "--tracking-uri", "bogus://x"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == err.strip().splitlines()[0] and "MLflow has no store for the scheme 'bogus'" in err

"""``automation.cold_start``: a run asked to warm-start from a run that has no finished model fails naming
it (``first_partition``, the default) or starts fresh with a warning and a tag (``allow``); never silently."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from jobkit import make_job

from primus_dagster.data.sources import TimeWindow
from primus_dagster.training.progress import Heartbeat
from primus_dagster.training.run_state import TrainingRequest, TrainingRun
from primus_dagster.training.window import MissingPredecessorError, load_warm_start

WINDOW = TimeWindow(datetime(2026, 11, 2, tzinfo=timezone.utc), datetime(2026, 11, 3, tzinfo=timezone.utc))


class NoModelTracker:
    """An MLflow tracker stand-in that knows no finished run."""

    def __init__(self) -> None:
        self.tags: dict[str, str] = {}

    def finished_run(self, run_key: str) -> None:
        return None

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags.update(tags)


def run_for(tmp_path, monkeypatch, cold_start: str | None) -> TrainingRun:
    monkeypatch.setenv("PRIMUS_HOME", str(tmp_path / "home"))
    job = make_job(tmp_path, hours=0)["job"]
    if cold_start is not None:
        job.automation.cold_start = cold_start
    cfg = TrainingRequest(job, tmp_path / "job.yaml", tmp_path, WINDOW, warm_start="train-test/2026-11-01")
    return TrainingRun(cfg, SimpleNamespace(set_tags=lambda tags: None), [], Heartbeat())


def test_by_default_a_missing_predecessor_is_an_error(tmp_path, monkeypatch) -> None:
    run = run_for(tmp_path, monkeypatch, None)
    with pytest.raises(MissingPredecessorError, match=r"no finished run 'train-test/2026-11-01'.*cold_start: allow"):
        load_warm_start(NoModelTracker(), run)


def test_allow_starts_fresh_loudly(tmp_path, monkeypatch, caplog) -> None:
    run = run_for(tmp_path, monkeypatch, "allow")
    tracker = NoModelTracker()
    with caplog.at_level(logging.WARNING, logger="primus_dagster.training.window"):
        source, why = load_warm_start(tracker, run)
    assert source is None and why == "no finished run 'train-test/2026-11-01' with a checkpoint to warm-start from"
    assert tracker.tags == {"primus.cold_start": why}
    assert "the model starts fresh (automation.cold_start: allow)" in caplog.text

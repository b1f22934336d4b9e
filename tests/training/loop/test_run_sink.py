"""The job process's sink: a checkpoint is logged once every rank's batches up to it were handed over, a
phase's last one only when its data did not fail; the group's progress (losses per round averaged over the
ranks that trained it, samples and speed summed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from primus_dagster.training.loop import ProgressPoint, RunSink, SavedCheckpoint
from primus_dagster.training.modes import phases
from primus_dagster.training.run_state import RunHooks


class FakeTracker:
    def __init__(self) -> None:
        self.points: list[tuple[str, float, int]] = []

    def log_metric_points(self, points: list[tuple[str, float, int]]) -> None:
        self.points += points


class FakeRun:
    """What a sink uses of a TrainingRun: its tracker, the checkpoints it logs, its progress and stages."""

    def __init__(self) -> None:
        self.tracker = FakeTracker()
        self.latest: Any = None
        self.logged: list[tuple[int, bool]] = []
        self.published: list[tuple[int, dict[str, float], dict[str, Any]]] = []
        self.stages: list[str] = []

    def log_checkpoint(
        self, directory: Path, step: int, phase: str, *, phase_done: bool, what: str, ranks: Any
    ) -> None:
        self.logged.append((step, phase_done))
        self.latest = type("Ref", (), {"path": directory})()

    def publish_progress(self, phase: str, step: int, metrics: dict[str, float], extra: dict[str, Any]) -> None:
        self.published.append((step, metrics, extra))

    def stage(self, text: str, *args: object) -> None:
        self.stages.append(text % args)


class FakeDriver:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error


class FakePlane:
    def __init__(self, error: Exception | None = None) -> None:
        self.driver = FakeDriver(error)


def saved(tmp_path: Path, step: int, phase_done: bool = False) -> SavedCheckpoint:
    directory = tmp_path / f"step-{step}"
    directory.mkdir()
    return SavedCheckpoint(step, str(directory), "mixed", phase_done, samples=step * 10, trainers=2)


def sink_of(run: FakeRun, plane: FakePlane | None = None, world: int = 2) -> RunSink:
    phase = phases("mixed")[0]
    return RunSink(run, RunHooks(), phase, plane or FakePlane(), world, progress_s=0.0)  # type: ignore[arg-type]


def test_a_checkpoint_waits_for_every_ranks_batches_and_the_one_before_is_deleted(tmp_path: Path) -> None:
    run = FakeRun()
    sink = sink_of(run)
    first, second = saved(tmp_path, 3), saved(tmp_path, 6)
    sink.checkpoint(0, 3, first)
    assert run.logged == [] and sink.pending == [first]  # rank 1 has not handed over its batches yet
    sink.checkpoint(1, 3, None)
    assert run.logged == [(3, False)]
    sink.checkpoint(1, 6, None)
    sink.checkpoint(0, 6, second)
    assert run.logged == [(3, False), (6, False)]
    assert not Path(first.path).exists() and Path(second.path).exists()
    assert any("first step of rank 0" in stage for stage in run.stages)


def test_a_phase_is_not_marked_done_when_its_data_failed(tmp_path: Path) -> None:
    run = FakeRun()
    sink = sink_of(run, FakePlane(RuntimeError("data failed")), world=1)
    with pytest.raises(RuntimeError, match="data failed"):
        sink.checkpoint(0, 4, saved(tmp_path, 4, phase_done=True))
    assert run.logged == []


def test_group_progress_averages_each_rounds_loss_over_the_ranks_that_trained_it() -> None:
    run = FakeRun()
    sink = sink_of(run)
    sink.progress(ProgressPoint(0, 2, 100, 50.0, 0.5, 0.7, ((1, 0.6), (2, 0.4))))
    assert [p for p in run.tracker.points if p[0] == "loss"] == []  # rank 1 has not reported past round 1
    sink.progress(ProgressPoint(1, 3, 80, 40.0, 0.3, 0.6, ((1, 0.2), (3, 0.8))))
    losses = [(step, round(value, 6)) for name, value, step in run.tracker.points if name == "loss"]
    assert losses == [(1, 0.4), (2, 0.4)]  # round 3: rank 0 may still report it
    step, metrics, extra = run.published[-1]
    assert step == 3 and metrics["samples"] == 180 and metrics["samples_per_s"] == 90.0
    assert metrics["train_auc"] == 0.7 and extra == {"trainers": 2, "loss": pytest.approx(0.4)}
    sink.publish(final=True)
    assert [s for name, _, s in run.tracker.points if name == "loss"] == [1, 2, 3]

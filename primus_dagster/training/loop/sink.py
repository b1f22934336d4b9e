"""Where a phase loop's news goes: the :class:`LoopSink` protocol, and :class:`RunSink`, the job process's.

A trainer tells its sink three things: a reader batch it trained whole (for ``RunHooks.on_batch``), a
progress point, and at every checkpoint of the group either what it saved (the rank that saves) or that its
batches up to that round were all told (every other rank). In the job's own process the loop's sink *is* the
:class:`RunSink`; a trainer process puts the same news on a queue and its job process hands it to a
:class:`RunSink` (:mod:`~primus_dagster.training.rank_group`). So one set of rules decides, for one
trainer and for many:

* a checkpoint is logged to MLflow only once every rank's batches up to it were handed to ``on_batch``
  (an audit never misses a batch a logged checkpoint covers), and a phase's last checkpoint only when its
  data did not fail; the one before it is then deleted from this machine;
* progress is the group's: samples and speed summed over the ranks, the loss of each round averaged over
  the ranks that trained it, the train AUC of rank 0; published at most every ``progress_s``.

Example::

    sink = RunSink(run, hooks, phase, plane, world=2)
    sink.checkpoint(1, 100, None)                         # rank 1: its batches up to round 100 are told
    sink.checkpoint(0, 100, saved)                        # rank 0 saved it: now it is logged
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from primus_dagster.data import Batch, DataPlane
from primus_dagster.training.modes import Phase
from primus_dagster.training.run_state import RunHooks, TrainingRun


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint the saving rank wrote: its round, directory, phase, the samples it covers over how many
    trainers, and every rank's counters (``RankCounters.to_dict``)."""

    step: int
    path: str
    phase: str
    phase_done: bool
    samples: int
    trainers: int
    ranks: tuple[dict[str, Any], ...] = ()
    stats: dict[str, Any] = field(default_factory=dict)  # the checkpoint's (checkpoint_record)


@dataclass(frozen=True)
class ProgressPoint:
    """One trainer's progress: its round, samples, samples per second of its optimiser steps, smoothed
    loss, progressive-validation AUC of its recent steps, and each round's loss since its last point."""

    rank: int
    step: int
    samples: int
    samples_per_s: float
    loss: float
    train_auc: float
    losses: tuple[tuple[int, float], ...] = ()


class LoopSink(Protocol):
    """Where a trainer's news goes (module docstring). ``wants_batches``: whether :meth:`batch_trained` is
    wanted at all (a trainer process then ships every trained reader batch to its job process)."""

    wants_batches: bool

    def batch_trained(self, rank: int, step: int, batch: Batch) -> None: ...

    def progress(self, point: ProgressPoint) -> None: ...

    def checkpoint(self, rank: int, step: int, saved: SavedCheckpoint | None) -> None:
        """Every rank at each checkpoint of its group, after handing over its batches up to ``step``:
        the saving rank with what it saved (None when it could not save this one), the others None."""
        ...


@dataclass
class _Losses:
    """Per-round loss sums and counts, until every rank has reported past them."""

    sums: dict[int, float] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    reported: dict[int, int] = field(default_factory=dict)  # rank -> the last round it reported

    def add(self, point: ProgressPoint) -> None:
        for step, loss in point.losses:
            self.sums[step] = self.sums.get(step, 0.0) + loss
            self.counts[step] = self.counts.get(step, 0) + 1
        self.reported[point.rank] = point.step

    def take(self, world: int, everything: bool) -> list[tuple[int, float]]:
        """The mean loss of each round every rank reported past (of every round held, ``everything``)."""
        if len(self.reported) < world and not everything:
            return []
        upto = max(self.reported.values(), default=0) if everything else min(self.reported.values())
        done = sorted(step for step in self.sums if step <= upto)
        out = [(step, self.sums.pop(step) / self.counts.pop(step)) for step in done]
        return out


class RunSink:
    """The job process's sink of one phase (module docstring): ``hooks.on_batch`` for trained batches,
    MLflow and the progress line for progress, MLflow for checkpoints, in the order the rules ask.

    Example::

        sink = RunSink(run, hooks, phase, plane, world=1)
        PhaseLoop(context, Solo(), reader, sink).run()
    """

    def __init__(
        self,
        run: TrainingRun,
        hooks: RunHooks,
        phase: Phase,
        plane: DataPlane,
        world: int,
        *,
        progress_s: float = 2.0,
        on_logged: Callable[[SavedCheckpoint], None] | None = None,
    ):
        self.run, self.hooks, self.phase, self.plane, self.world = run, hooks, phase, plane, world
        self.wants_batches = hooks.on_batch is not None
        self.progress_s, self.on_logged = progress_s, on_logged
        self.marks: dict[int, int] = {}  # rank -> the last checkpoint round whose batches it has handed over
        self.pending: list[SavedCheckpoint] = []
        self.latest: dict[int, ProgressPoint] = {}
        self._losses = _Losses()
        self._published = 0.0
        self._began, self._training = time.monotonic(), False
        self.step = 0  # the latest logged checkpoint's round
        self.last: SavedCheckpoint | None = None  # the latest logged checkpoint

    def _news(self, rank: int) -> None:
        """The run log's stage line once the phase's first trainer news comes."""
        if not self._training:
            self._training = True
            waited = time.monotonic() - self._began
            self.run.stage("phase %s: training (first step of rank %d after %.1f s)", self.phase.name, rank, waited)

    def batch_trained(self, rank: int, step: int, batch: Batch) -> None:
        if self.hooks.on_batch is not None:
            self.hooks.on_batch(step, batch, rank)

    def progress(self, point: ProgressPoint) -> None:
        self._news(point.rank)
        self.latest[point.rank] = point
        self._losses.add(point)
        if time.monotonic() - self._published >= self.progress_s:
            self.publish()

    def publish(self, *, step: int | None = None, samples: int | None = None, final: bool = False) -> None:
        """A progress point of the group now (``step`` / ``samples``: a checkpoint's exact figures;
        ``final``: the phase's last point, every held loss logged)."""
        self._published = time.monotonic()
        seen = list(self.latest.values())
        self.run.tracker.log_metric_points([("loss", loss, s) for s, loss in self._losses.take(self.world, final)])
        if not seen:
            return
        losses = [p.loss for p in seen if p.loss == p.loss]  # NaN: no step yet
        metrics = {
            "samples_per_s": sum(p.samples_per_s for p in seen),
            "samples": samples if samples is not None else sum(p.samples for p in seen),
            "train_auc": self.latest[0].train_auc if 0 in self.latest else seen[0].train_auc,
        }
        at = step if step is not None else max(p.step for p in seen)
        # "loss" goes to MLflow round by round (above); the progress line shows the ranks' smoothed loss
        smoothed = sum(losses) / len(losses) if losses else float("nan")
        self.run.publish_progress(self.phase.name, at, metrics, {"trainers": self.world, "loss": smoothed})

    def checkpoint(self, rank: int, step: int, saved: SavedCheckpoint | None) -> None:
        self._news(rank)
        self.marks[rank] = step
        if saved is not None:
            self.pending.append(saved)
        while self.pending and len(self.marks) == self.world and min(self.marks.values()) >= self.pending[0].step:
            self._log(self.pending.pop(0))

    def _log(self, saved: SavedCheckpoint) -> None:
        if saved.phase_done:
            self.plane.driver.raise_if_failed()  # a failed data set must not be marked done
        directory, previous = Path(saved.path), self.run.latest
        what = f"{saved.samples} samples" + (f" over {saved.trainers} trainers" if saved.trainers > 1 else "")
        self.step, self.last = saved.step, saved
        self.run.log_checkpoint(
            directory, saved.step, saved.phase, phase_done=saved.phase_done, what=what, ranks=saved.ranks
        )
        if saved.phase_done:  # the phase's final counts (progress is published every progress_s)
            self.publish(step=saved.step, samples=saved.samples, final=True)
        if previous is not None and previous.path != directory:
            shutil.rmtree(previous.path, ignore_errors=True)
        if self.on_logged is not None:
            self.on_logged(saved)

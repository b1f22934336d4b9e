"""What trains a window run's phases: the :class:`PhaseTrainer` protocol, its failure
(:class:`TrainerFailedError`) and the skeleton both trainers share (:class:`LoopPhaseTrainer`).

:func:`~primus_dagster.training.window.train_window` (the skeleton) knows trainers only through this module:
which one a job gets is :func:`~primus_dagster.training.trainers.phase_trainer`'s choice, and a trainer that
fails in a way the skeleton may retry says so in the error it raises, not by its class. Both trainers train
every phase with the one :class:`~primus_dagster.training.loop.PhaseLoop`; :class:`LoopPhaseTrainer` holds
what they share around it: the rounds so far, the final model, the run's training figures.

Example::

    trainer: PhaseTrainer = phase_trainer(job, hooks)      # training/trainers.py
    try:
        trainer.train_phase(run, phase, plane)
    except TrainerFailedError as exc:
        if exc.restartable: ...                           # start again from the latest checkpoint
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from primus_dagster.data import DataPlane
from primus_dagster.training.checkpoint import Checkpoint, load_checkpoint
from primus_dagster.training.features import ModelInit
from primus_dagster.training.loop import RankResult, SavedCheckpoint
from primus_dagster.training.models import RecModel, build_initial_model
from primus_dagster.training.modes import Phase
from primus_dagster.training.planning import NoTrainingDataError
from primus_dagster.training.run_state import TrainingRun


class TrainerFailedError(RuntimeError):
    """A trainer of the run failed (raised, died, went over its memory, lost its peers); the message names
    it and carries its traceback. ``restartable``: the failure is the trainer's own and the run's state is
    in its latest checkpoint, so the skeleton may start the trainer again from there (while
    ``pools.training.restart`` allows); False: the run fails.

    Example::

        raise TrainerFailedError("trainer rank 1 died with exit code -9", restartable=True)
    """

    def __init__(self, message: str, *, restartable: bool):
        super().__init__(message)
        self.restartable = restartable

    def __reduce__(self) -> tuple[Any, ...]:  # pickled with its keyword (RuntimeError's would drop it)
        return (_rebuild, (str(self), self.restartable))


def _rebuild(message: str, restartable: bool) -> TrainerFailedError:
    return TrainerFailedError(message, restartable=restartable)


class PhaseTrainer(Protocol):
    """What trains a window run's phases: one trainer in this process, or a group of trainer processes.

    The skeleton calls :meth:`train_phase` for each phase on the phase's started data plane (the run's
    latest checkpoint, ``run.latest``, is where a phase starts: a resume, a restart or the phase before);
    at the end :meth:`final_model` and :meth:`stats`. A trainer checkpoints through :meth:`TrainingRun.log_checkpoint`, which makes the
    checkpoint the run's latest (where later phases and restarts start), and closes each phase with a
    checkpoint that says so. A failure the skeleton may retry is a :class:`TrainerFailedError` with
    ``restartable`` set.

    Example::

        trainer: PhaseTrainer = phase_trainer(job, hooks)
        params, tags = trainer.describe()        # extra MLflow params and tags of the run
    """

    trainers: int

    @property
    def step(self) -> int:
        """The rounds trained so far (one optimiser step of every trainer of the group a round)."""
        ...

    def describe(self) -> tuple[dict[str, Any], dict[str, str]]: ...

    def train_phase(self, run: TrainingRun, phase: Phase, plane: DataPlane) -> None: ...

    def final_model(self, run: TrainingRun) -> tuple[RecModel, int]: ...

    def stats(self, run: TrainingRun) -> dict[str, Any]: ...


class LoopPhaseTrainer:
    """What both trainers share around the phase loop: the rounds so far (the latest checkpoint's), every
    rank's figures over the run's phases, the final model -- the run's latest checkpoint's, unless the
    trainer holds it in memory (:meth:`in_memory_model`) -- and the run's training figures (:meth:`stats`).
    Subclasses implement :meth:`train_phase` and call :meth:`record` with each phase's results.

    Example::

        class MyTrainer(LoopPhaseTrainer):
            def train_phase(self, run, phase, plane):
                ...                                         # PhaseLoop(...).run(); .finish()
                self.record(saved, [loop.result()])
    """

    trainers = 1

    def __init__(self) -> None:
        self.results: list[RankResult] = []  # the last phase's, by rank
        self._trained: dict[int, list[float]] = {}  # rank -> [samples trained, seconds in its steps] so far
        self._last: SavedCheckpoint | None = None
        self._final: Checkpoint | None = None

    @property
    def step(self) -> int:
        return self._last.step if self._last is not None else 0

    def describe(self) -> tuple[dict[str, Any], dict[str, str]]:
        return {"trainers": self.trainers}, {"primus.trainers": str(self.trainers)}

    def train_phase(self, run: TrainingRun, phase: Phase, plane: DataPlane) -> None:
        raise NotImplementedError

    def record(self, last: SavedCheckpoint | None, results: Sequence[RankResult]) -> None:
        """A phase's end: its last logged checkpoint and every rank's result."""
        self._last = last if last is not None else self._last
        self.results = list(results)
        for r in results:
            trained = self._trained.setdefault(r.rank, [0, 0.0])
            trained[0] += r.samples_trained
            trained[1] += r.train_s

    def in_memory_model(self) -> RecModel | None:
        """The trained model where this process holds it (None: it is the latest checkpoint's)."""
        return None

    def final_model(self, run: TrainingRun) -> tuple[RecModel, int]:
        if run.latest is None:
            raise NoTrainingDataError(f"job {run.job.name}: the window {run.request.window} produced no batches")
        model = self.in_memory_model()
        if model is not None:
            return model, run.latest.step
        final = self._final = load_checkpoint(run.latest.path)
        spec = run.spec
        model = build_initial_model(spec.model, ModelInit.of_checkpoint(final.extra, spec.model), seed=spec.seed)
        model.load_state_dict(final.model_state)
        return model, final.step

    def stats(self, run: TrainingRun) -> dict[str, Any]:
        """The run's training figures: the final checkpoint's (rounds, samples per kind, kernels), the
        ranks' smoothed loss and samples per second of their optimiser steps (summed over the ranks), and
        each rank's result of the last phase."""
        if self._last is not None:
            base = dict(self._last.stats)
        elif run.latest is not None:  # everything was trained before a restart: the checkpoint it resumed from
            final = self._final if self._final is not None else load_checkpoint(run.latest.path)
            base = dict(final.extra.get("stats") or {})
        else:
            base = {}
        losses = [r.loss for r in self.results if r.loss == r.loss]
        speeds = [samples / seconds for samples, seconds in self._trained.values() if seconds > 0]
        return {
            **base,
            "loss": sum(losses) / len(losses) if losses else float("nan"),
            "samples_per_s": round(sum(speeds), 1),
            "trainers": self.trainers,
            "ranks": [r.as_dict() for r in self.results],
        }

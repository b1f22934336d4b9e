"""What a window run is asked to do (:class:`TrainingRequest`, :class:`RunHooks`) and the state every
run keeps while it trains, whoever trains it (:class:`TrainingRun`).

A *run* is one MLflow run of a job on one window (or one live increment): it is started, or resumed
by its run key, by :func:`~primus_dagster.training.window.train_window`. The state here is what the
skeleton and both :class:`~primus_dagster.training.phase_trainer.PhaseTrainer` implementations share: the
tracker, the planned tasks and their source versions, the run's scratch folder, the checkpoints it
logged (the latest one is where a restart or a later phase starts from), what the data pools did and
the data-quality counts, and the run log's stage lines.

Example::

    request = TrainingRequest(job, "job.yaml", "/data", TimeWindow(t0, t0 + timedelta(hours=24)))
    result = train_window(request, RunHooks(on_batch=lambda step, batch, trainer: print(step, batch.rows)))
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from primus_dagster.data import Batch, DataPlaneStarter, DataTask, TimeWindow, source_versions
from primus_dagster.paths import primus_home
from primus_dagster.spec import JobSpec
from primus_dagster.training.checkpoint import Checkpoint, load_checkpoint
from primus_dagster.training.features import ModelInit
from primus_dagster.training.memory_plan import MemoryPlan
from primus_dagster.training.modes import phase_index
from primus_dagster.training.planning import EmptyPartition, consumed_sources
from primus_dagster.training.progress import Heartbeat

if TYPE_CHECKING:  # a trainer rank imports this module and never MLflow
    from primus_dagster.training.tracking import MlflowTracker

log = logging.getLogger(__name__)

RankHook = Callable[[int, int], None]
"""``(rank, round)``, called in every trainer before each round -- in the rank processes of a group --
(fault injection, audits); module-level functions only: it is pickled into the spawned ranks."""

BatchHook = Callable[[int, Batch, int], None]
"""``(step, batch, trainer)``: a reader batch trained whole (:attr:`RunHooks.on_batch`)."""


@dataclass
class TrainingRequest:
    """What to run: the job spec (and its file, which executor processes load), where the data is,
    the window; ``executors``: data executors (default ``pools.data.replicas``); ``run_key``: the
    MLflow run to start or resume (default ``<job>/<window>``).

    Example::

        request = TrainingRequest(job, "job.yaml", "/data", TimeWindow(t0, t0 + timedelta(hours=24)))
        request.key()            # 'ctr/2026-11-01T00/2026-11-02T00'
    """

    job: JobSpec
    job_path: str | Path
    data_root: str | Path
    window: TimeWindow
    kafka_bootstrap: str | None = None
    executors: int | None = None
    run_key: str | None = None
    tracker: MlflowTracker | None = None
    progress: Callable[[dict[str, Any]], None] | None = None
    evaluate: bool = True
    warm_start: str | None = None  # run key whose finished model (and Adam state) this run continues from
    tasks: list[DataTask] | None = None  # planned elsewhere (a live stream increment) instead of from ``window``
    tags: dict[str, str] = field(default_factory=dict)  # extra MLflow run tags
    strict: bool = False  # any task given up fails the run (``train --strict``), as data.allow_failed_tasks: false
    # partitions not ready inside the window fail the run before it starts, naming them (the training asset:
    # a materialisation stands for its whole window; ``train --strict``); otherwise they are skipped loudly
    complete_window: bool = False

    def key(self) -> str:
        return self.run_key or f"{self.job.name}/{self.window.start:%Y-%m-%dT%H}/{self.window.end:%Y-%m-%dT%H}"


@dataclass
class RunHooks:
    """Extension points of :func:`~primus_dagster.training.window.train_window` that are not part of
    *what* to run.

    ``on_batch(step, batch, trainer)`` is called in the job process after trainer ``trainer`` (its rank,
    0 for one trainer) trained reader batch ``batch`` whole at round ``step`` (audits: which samples a
    step consumed, in each trainer's order); ``data_plane`` starts the data plane of a phase (default:
    what :func:`~primus_dagster.cluster.backends.data_plane_starter` picks for the job's
    ``pools.backend``; tests pass one with injected faults); ``rank_hook(rank, round)`` runs in every
    trainer before each round -- in the rank processes of a group -- (tests inject faults).

    Example::

        seen = []
        train_window(request, RunHooks(on_batch=lambda step, batch, trainer: seen.append(batch.rows)))
    """

    on_batch: BatchHook | None = None
    data_plane: DataPlaneStarter | None = None
    rank_hook: RankHook | None = None


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint this run logged (or resumed from): where its files are on this machine, and the
    counters of every rank it covers (``RankCounters.to_dict``)."""

    step: int
    phase: str
    phase_done: bool
    path: Path
    ranks: tuple[dict[str, Any], ...] = ()


class TrainingRun:
    """The state of one run, shared by the window skeleton and whichever trainer trains its phases
    (module docstring). Its scratch folder (``workdir``) is emptied at the start, so what a killed
    attempt left is reclaimed.

    Example::

        run = TrainingRun(request, tracker, tasks, beat)
        run.stage("phase %s: starting", "mixed")
        run.log_checkpoint(directory, step=100, phase="mixed", phase_done=False, what="102400 samples")
    """

    def __init__(
        self,
        request: TrainingRequest,
        tracker: MlflowTracker,
        tasks: list[DataTask],
        beat: Heartbeat,
        device: torch.device | None = None,
    ):
        self.request, self.tracker, self.tasks, self.beat = request, tracker, tasks, beat
        self.device = device if device is not None else torch.device("cpu")  # training.device, resolved
        self.job = request.job
        self.spec = request.job.training
        self.versions = source_versions(tasks)
        self.consumed = consumed_sources(request.job, tasks)
        self.latest: CheckpointRef | None = None  # resumed from or logged last: later phases and restarts start here
        self.warm: Checkpoint | None = None  # a previous run's final model: its weights and Adam state only
        self.warm_path: Path | None = None  # ... and where its files are
        # the model's feature layout (and, for a fresh model, its dense statistics): set before the phases
        self.model_init: ModelInit | None = None
        # how the trainers hold the tables (training.sharding, resolved on the layout): set before the phases
        self.memory_plan: MemoryPlan | None = None
        self.checkpoints: list[int] = []
        self.data_pools: dict[str, dict[str, Any]] = {}  # phase -> what its data pool did (executors, scaling)
        self.data_quality: dict[str, dict[str, int]] = {}  # source -> quality rule -> rows repaired/dropped
        self.empty_partitions: list[EmptyPartition] = []  # ready partitions of the window without a row
        # source -> rule -> {"where": {file or offset range: rows} (the first QUALITY_PLACES_KEPT), "more": places}
        self.quality_places: dict[str, dict[str, dict[str, Any]]] = {}
        # phase -> the tasks its driver gave up (rows of training.failed_tasks.failed_task_rows)
        self.failed_tasks: dict[str, list[dict[str, Any]]] = {}
        # One scratch folder per run key. The data root and spec path are part of its name: runs of one job and
        # window over other data (tests, a second environment) must not share it.
        scratch = f"{request.key()}|{Path(request.data_root).resolve()}|{Path(request.job_path).resolve()}"
        self.workdir = primus_home() / "train" / hashlib.sha1(scratch.encode()).hexdigest()[:16]
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        self.started = time.monotonic()

    def stage(self, text: str, *args: object) -> None:
        """Log a stage line of the run (and keep the heartbeat on it)."""
        self.beat.stage(text, *args)

    def first_phase(self) -> int:
        """The index of the phase to train next: the latest checkpoint's, or the one after it when it
        closed its phase; 0 without one."""
        if self.latest is None:
            return 0
        return phase_index(self.spec.mode, self.latest.phase) + (1 if self.latest.phase_done else 0)

    def checkpoint_in(self, phase: str) -> Checkpoint | None:
        """The latest checkpoint when it was taken in ``phase`` (its driver snapshot restores the phase's
        data progress), else None."""
        if self.latest is None or self.latest.phase != phase:
            return None
        return load_checkpoint(self.latest.path)

    def log_checkpoint(
        self,
        directory: Path,
        step: int,
        phase: str,
        *,
        phase_done: bool,
        what: str,
        ranks: tuple[dict[str, Any], ...] = (),
    ) -> None:
        """Upload a saved checkpoint to MLflow (keeping ``training.checkpoint_keep_last``), record it as
        the latest and say so in the run log (``what``: the samples it covers; ``ranks``: every rank's
        counters in it)."""
        self.tracker.log_checkpoint(directory, step, keep_last=self.spec.checkpoint_keep_last)
        self.tracker.log_metrics({"checkpoint_step": step}, step)
        self.checkpoints.append(step)
        self.latest = CheckpointRef(step, phase, phase_done, directory, ranks)
        log.info("checkpoint at step %d (%s, phase %s%s)", step, what, phase, ", done" if phase_done else "")
        self.beat.quiet_stage(f"phase {phase}: training (step {step})")

    def publish_progress(self, phase: str, step: int, metrics: dict[str, float], extra: dict[str, Any]) -> None:
        """A progress point: ``metrics`` to MLflow at ``step``, and the request's ``progress`` callback
        (the terminal's and the Dagster run log's progress line) with ``extra``."""
        self.tracker.log_metrics(metrics, step)
        if self.request.progress is not None:
            self.request.progress({"phase": phase, "step": step, **extra, **metrics})
            self.beat.touch()

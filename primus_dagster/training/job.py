"""A whole training job: plan -> data plane -> reader -> trainer -> checkpoints -> evaluation.

:func:`train_window` trains the job's model on one data window:

1. DTGG plans the window; the tasks' source versions (Delta version, Iceberg snapshot, Kafka
   offsets) are recorded.
2. The MLflow run for ``run_key`` is started -- or resumed: a run with that key that did not
   finish (a killed trainer leaves it RUNNING) continues from its latest checkpoint.
3. Each phase of the mode (``modes``) runs its tasks through a local data plane (driver +
   executor processes); the trainer consumes the reader's batches (``mixed``: the mixture
   prioritisation picks the queue). Every ``checkpoint_every_steps`` steps, between reader
   batches, the reader reports its consumed batches at a barrier and the checkpoint stores
   model, optimizer, counters, the driver's barrier snapshot and the source versions.
4. The model is evaluated on the hours after the window (next-hour AUC / log loss) and logged
   with ``mlflow.pytorch``.

Example::

    result = train_window(TrainingRequest(job, "job.yaml", "/data", TimeWindow(t0, t0 + 24h)))
    result.evaluation.auc, result.run_id, result.model_uri
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from primus_dagster.cluster.backends import DataPlaneStarter, data_plane_starter
from primus_dagster.data import (
    Batch,
    ChooseQueue,
    DataDriver,
    DataTask,
    NotReady,
    SourceContext,
    TimeWindow,
    quality_summary,
    source_versions,
)
from primus_dagster.paths import primus_home
from primus_dagster.spec import JobSpec
from primus_dagster.training.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from primus_dagster.training.evaluation import NextHourEvaluation, evaluate_window
from primus_dagster.training.models import RecModel, build_model, model_summary
from primus_dagster.training.modes import Phase, phase_index, phase_tasks, phases
from primus_dagster.training.planning import (
    NoTrainingDataError,
    consumed_sources,
    plan_training_tasks,
    planned_line,
)
from primus_dagster.training.priority import LoadingPriority, MixturePriority
from primus_dagster.training.progress import Heartbeat
from primus_dagster.training.tracking import MlflowTracker
from primus_dagster.training.trainer import Trainer

log = logging.getLogger(__name__)


#: Places (files, Kafka offset ranges) kept per source and rule where rows were repaired or dropped (the
#: result, its metadata and checkpoints), and how many of them a run-log line names.
QUALITY_PLACES_KEPT = 20
QUALITY_PLACES_LOGGED = 3
RUN_KIND_TAG = "primus.run_kind"  # "window": a planned window (a training partition); "live": a stream increment


class MissingPredecessorError(RuntimeError):
    """The run should continue the model of the window before it (``warm_start``), which has no finished
    model, and ``automation.cold_start`` does not allow a fresh start."""


@dataclass
class TrainingRequest:
    """What to run: the job spec (and its file, which executor processes load), where the data is,
    the window; ``executors``: data executors (default ``pools.data.replicas``); ``run_key``: the
    MLflow run to start or resume (default ``<job>/<window>``)."""

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

    def key(self) -> str:
        return self.run_key or f"{self.job.name}/{self.window.start:%Y-%m-%dT%H}/{self.window.end:%Y-%m-%dT%H}"


@dataclass
class RunHooks:
    """Extension points of :func:`train_window` that are not part of *what* to run.

    ``on_batch(step, batch)`` is called after each trained reader batch (audits: which samples a
    step consumed); ``data_plane`` starts the data plane of a phase (default: what
    :func:`~primus_dagster.cluster.backends.data_plane_starter` picks for the job's ``pools.backend``
    -- a :class:`~primus_dagster.cluster.pooled_plane.PooledDataPlane` on its pool, or executors in
    this process for ``in_trainer``; anything with :class:`DirectDataPlane`'s signature works -- tests
    pass one with injected faults).

    Example::

        seen = []
        train_window(cfg, RunHooks(on_batch=lambda step, batch: seen.append(batch.rows)))
    """

    on_batch: Callable[[int, Batch], None] | None = None
    data_plane: DataPlaneStarter | None = None


@dataclass
class TrainingResult:
    """What a job produced (also the training asset's metadata, see :meth:`metadata`)."""

    run_id: str
    run_url: str
    model_uri: str | None
    window: TimeWindow
    stats: dict[str, Any]
    evaluation: NextHourEvaluation | None
    source_versions: dict[str, Any]
    checkpoints: list[int] = field(default_factory=list)
    resumed_from_step: int | None = None
    warm_started_from: str | None = None  # MLflow run id
    cold_start: str | None = None  # why a run asked to warm-start began from a fresh model
    wall_s: float = 0.0
    data_pools: dict[str, dict[str, Any]] = field(default_factory=dict)  # phase -> executors, restarts, scaling
    skipped_partitions: list[dict[str, Any]] = field(default_factory=list)  # not ready inside the window
    consumed: dict[str, dict[str, Any]] = field(default_factory=dict)  # per source: see consumed_sources
    data_quality: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> quality rule -> rows touched
    # source -> quality rule -> ["<file or offset range>: N rows", ..., "... and N more"]
    data_quality_where: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mlflow_run_id": self.run_id,
            "mlflow_run_url": self.run_url,
            "model_uri": self.model_uri or "",
            "window_start": self.window.start.isoformat(),
            "window_end": self.window.end.isoformat(),
            "samples": self.stats.get("samples", 0),
            "steps": self.stats.get("step", 0),
            "samples_per_s": self.stats.get("samples_per_s", 0.0),
            "wall_s": round(self.wall_s, 2),
            "checkpoints": len(self.checkpoints),
            "resumed_from_step": self.resumed_from_step,
            "warm_started_from": self.warm_started_from,
            "cold_start": self.cold_start,
            "source_versions": self.source_versions,
            "data_pools": self.data_pools,
            "skipped_partitions": self.skipped_partitions,
            "consumed_partitions": {name: entry["partitions"] for name, entry in self.consumed.items()},
            "data_quality": self.data_quality,
            "data_quality_rows": sum(n for counts in self.data_quality.values() for n in counts.values()),
            "data_quality_where": self.data_quality_where,
        }
        if self.evaluation is not None:
            out.update({f"eval_{k}": v for k, v in self.evaluation.result.to_dict().items()})
            out["eval_labels"] = self.evaluation.labels
            out["eval_window"] = f"{self.evaluation.window.start.isoformat()}/{self.evaluation.window.end.isoformat()}"
        return out


def progress_line(progress: dict[str, Any]) -> str:
    """One line of a run's progress (what ``TrainingRequest.progress`` receives), for logs and terminals."""
    return (
        f"[{progress['phase']}] step {progress['step']:,}  samples {progress['samples']:,}  "
        f"loss {progress['loss']:.4f}  train-AUC {progress['train_auc']:.4f}  "
        f"{progress['samples_per_s']:,.0f} samples/s"
    )


def run_params(job: JobSpec, window: TimeWindow, executors: int) -> dict[str, Any]:
    """The MLflow params of a training run of ``job`` on ``window``."""
    t, m = job.training, job.training.model
    return {
        "job": job.name,
        "mode": t.mode,
        "model": m.type,
        "embedding_dim": m.embedding_dim,
        "hash_buckets": m.hash_buckets,
        "memory_hidden": m.memory_hidden,
        "adapt_hidden": m.adapt_hidden,
        "batch_size": t.batch_size,
        "learning_rate": t.learning_rate,
        "seed": t.seed,
        "priority_weights": job.kind_weights(),
        "batch_lag": str(t.batch_lag),
        "window_start": window.start.isoformat(),
        "window_end": window.end.isoformat(),
        "data_executors": executors,
    }


class TrainingRun:
    """State of one run of :func:`train_window` (model built at the first batch: its input
    widths come from the data)."""

    def __init__(self, cfg: TrainingRequest, tracker: MlflowTracker, tasks: list[DataTask]):
        self.cfg, self.tracker, self.tasks = cfg, tracker, tasks
        self.spec = cfg.job.training
        self.versions = source_versions(tasks)
        self.consumed = consumed_sources(cfg.job, tasks)
        self.beat: Heartbeat | None = None  # the run log's stage lines (train_window sets it)
        self.trainer: Trainer | None = None
        self.pending: Checkpoint | None = None  # loaded, applied when the model exists
        self.warm: Checkpoint | None = None  # a previous run's final model: its weights and Adam state only
        self.checkpoints: list[int] = []
        self.data_pools: dict[str, dict[str, Any]] = {}  # phase -> what its data pool did (executors, scaling)
        self.data_quality: dict[str, dict[str, int]] = {}  # source -> quality rule -> rows repaired/dropped
        # source -> rule -> {"where": {file or offset range: rows} (the first QUALITY_PLACES_KEPT), "more": places}
        self.quality_places: dict[str, dict[str, dict[str, Any]]] = {}
        self.next_checkpoint = self.spec.checkpoint_every_steps
        # One scratch folder per run key, emptied at start: what a killed attempt left is reclaimed. The
        # data root and spec path are part of its name: runs of one job and window over other data (tests,
        # a second environment) must not share it.
        scratch = f"{cfg.key()}|{Path(cfg.data_root).resolve()}|{Path(cfg.job_path).resolve()}"
        self.workdir = primus_home() / "train" / hashlib.sha1(scratch.encode()).hexdigest()[:16]
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        self._last_progress = 0.0
        self.started = time.monotonic()

    def ensure_trainer(self, n_dense: int, n_sparse: int) -> Trainer:
        if self.trainer is None:
            model = build_model(self.spec.model, n_dense, n_sparse, seed=self.spec.seed)
            self.trainer = Trainer(model, self.spec)
            self.tracker.set_tags({"primus.model": str(model_summary(model))})
            if self.pending is not None:
                ck = self.pending
                self.trainer.restore(
                    ck.model_state,
                    ck.optimizer_state,
                    step=ck.step,
                    samples=ck.samples,
                    samples_by_kind=ck.extra.get("samples_by_kind"),
                )
                self.next_checkpoint = ck.step + self.spec.checkpoint_every_steps
            elif self.warm is not None:
                try:
                    self.trainer.model.load_state_dict(self.warm.model_state)
                    self.trainer.optimizer.load_state_dict(self.warm.optimizer_state)
                except (RuntimeError, ValueError) as exc:
                    raise ValueError(
                        f"cannot warm-start from run key {self.cfg.warm_start!r}: its model does not "
                        f"fit this job's (was training.model or the columns changed?): {exc}"
                    ) from exc
        return self.trainer

    def checkpoint(self, phase: Phase, snapshot: dict[str, Any] | None, *, phase_done: bool) -> None:
        trainer = self.trainer
        if trainer is None:
            return
        model_state, optimizer_state = trainer.state()
        stats = trainer.stats()
        ck = Checkpoint(
            step=trainer.step,
            samples=trainer.counters.samples,
            model_state=model_state,
            optimizer_state=optimizer_state,
            data_snapshot=snapshot,
            source_versions=self.versions,
            phase=phase.name,
            extra={
                "phase_done": phase_done,
                "samples_by_kind": dict(trainer.counters.samples_by_kind),
                "mode": self.spec.mode,
                "window": [self.cfg.window.start.isoformat(), self.cfg.window.end.isoformat()],
                "n_dense": trainer.model.n_dense,
                "n_sparse": trainer.model.n_sparse,
                "stats": stats,
                # the finished phases' quality counts (the current phase's are in its driver snapshot)
                "data_quality": self.data_quality,
                "data_quality_places": self.quality_places,
            },
        )
        directory = save_checkpoint(ck, self.workdir / "checkpoint")
        self.tracker.log_checkpoint(directory, trainer.step, keep_last=self.spec.checkpoint_keep_last)
        self.tracker.log_metrics({"checkpoint_step": trainer.step}, trainer.step)
        self.checkpoints.append(trainer.step)
        self.next_checkpoint = trainer.step + self.spec.checkpoint_every_steps
        log.info(
            "checkpoint at step %d (%s, phase %s%s)",
            trainer.step,
            f"{ck.samples} samples",
            phase.name,
            ", done" if phase_done else "",
        )

    def report(self, phase: Phase, force: bool = False) -> None:
        now = time.monotonic()
        if self.trainer is None or (not force and now - self._last_progress < 2.0):
            return
        self._last_progress = now
        stats = self.trainer.stats()
        metrics = {
            "samples_per_s": stats["samples_per_s"],
            "samples": stats["samples"],
            "train_auc": self.trainer.recent_auc(),
        }
        # Every step's loss (sent in one batch every 2 s), the slower-moving figures at the current step.
        losses, self.trainer.step_losses = self.trainer.step_losses, []
        self.tracker.log_metric_points([("loss", loss, step) for step, loss in losses])
        self.tracker.log_metrics(metrics, self.trainer.step)
        if self.cfg.progress is not None:
            self.cfg.progress({"phase": phase.name, **stats, "train_auc": metrics["train_auc"]})
            if self.beat is not None:
                self.beat.touch()

    def stage(self, text: str, *args: object) -> None:
        """Log a stage line of the run (and keep the heartbeat on it)."""
        if self.beat is not None:
            self.beat.stage(text, *args)
        else:
            log.info(text, *args)


def driver_for(
    cfg: TrainingRequest, run: TrainingRun, phase: Phase, resume: Checkpoint | None, trainers: int = 1
) -> DataDriver:
    """The data driver of ``phase`` serving ``trainers`` readers: restored from ``resume``'s barrier
    snapshot when it was taken in this phase, else fresh with the phase's tasks."""
    data = cfg.job.data
    if resume is not None and resume.phase == phase.name and resume.data_snapshot is not None:
        driver = DataDriver.restore(resume.data_snapshot, trainers=trainers)
        log.info("phase %s: data progress restored from the checkpoint at step %d", phase.name, resume.step)
    else:
        driver = DataDriver.for_job(data, trainers=trainers)
        driver.add_tasks(phase_tasks(run.tasks, phase))
    driver.source_versions = dict(run.versions)
    return driver


def _run_phase(
    cfg: TrainingRequest, run: TrainingRun, phase: Phase, driver: DataDriver, executors: int, hooks: RunHooks
) -> None:
    spec = cfg.job.training
    # Both kinds live: q_i weighs the serving buffers (rows per kind at the executors and in the
    # reader queue); it steers both what the driver leases next and what the reader serves.
    weights = cfg.job.kind_weights()
    chooser: ChooseQueue | None = (
        MixturePriority(weights, seed=spec.seed, backlog_fn=driver.serving_rows_by_kind, queue_rows=True)
        if phase.prioritised
        else None
    )
    driver.loading_policy = LoadingPriority(weights) if phase.prioritised else None
    token = secrets.token_hex(16)
    start_plane = hooks.data_plane or data_plane_starter(cfg.job, run_id=cfg.key())
    run.stage(
        "phase %s: %d task(s) to read; starting %d data executor(s)",
        phase.name,
        sum(driver.backlog_by_kind().values()),
        executors,
    )
    phase_started = time.monotonic()
    with start_plane(
        cfg.job_path,
        cfg.data_root,
        driver=driver,
        executors=executors,
        trainers=1,
        token=token,
        kafka_bootstrap=cfg.kafka_bootstrap,
    ) as plane:
        run.stage("phase %s: data executors up; waiting for the first batch", phase.name)
        first_batch = True
        with plane.reader(0, choose_queue=chooser) as reader:
            for batch in reader:
                if first_batch:
                    first_batch = False
                    run.stage(
                        "phase %s: training (first batch after %.1f s)", phase.name, time.monotonic() - phase_started
                    )
                trainer = run.ensure_trainer(batch.dense.shape[1], batch.sparse.shape[1])
                trainer.train(batch)
                if hooks.on_batch is not None:
                    hooks.on_batch(trainer.step, batch)
                run.report(phase)
                if trainer.step >= run.next_checkpoint:
                    run.stage("phase %s: step %d: checkpoint barrier, save, upload", phase.name, trainer.step)
                    snapshot = reader.barrier(trainer.step, wait_s=30)
                    if snapshot is None:  # without the data progress a restore would replay trained samples
                        log.warning("no barrier snapshot at step %d: checkpoint skipped", trainer.step)
                        run.next_checkpoint = trainer.step + spec.checkpoint_every_steps
                    else:
                        run.checkpoint(phase, snapshot, phase_done=False)
                    if run.beat is not None:
                        run.beat.quiet_stage(f"phase {phase.name}: training (step {trainer.step})")
        summary = getattr(plane, "summary", None)
        if summary is not None:
            pool = summary()
            started = getattr(plane, "started_at", None)
            _log_pool_timeline(run, pool.pop("timeline", []), (started or run.started) - run.started)
            if isinstance(pool.get("scaling"), dict):
                pool["scaling"] = {k: v for k, v in pool["scaling"].items() if k != "timeline"}
            run.data_pools[phase.name] = pool  # the timeline is in MLflow, as metrics
        plane.driver.raise_if_failed()
    _record_quality(run, phase, driver)
    run.report(phase, force=True)
    run.stage("phase %s: all data read; final checkpoint of the phase", phase.name)
    run.checkpoint(phase, None, phase_done=True)


_TIMELINE_METRICS = {
    "replicas": "data_replicas",
    "target_replicas": "data_target_replicas",
    "cpu_util": "data_cpu_util",
    "memory_util": "data_memory_util",
    "load": "data_load",
}


def merge_quality_places(
    into: dict[str, dict[str, dict[str, Any]]], by_location: dict[str, dict[str, dict[str, int]]], keep: int
) -> None:
    """Add a phase's ``by_location`` counts (source -> rule -> {place: rows}) to ``into`` (see
    ``TrainingRun.quality_places``): the first ``keep`` places per source and rule are kept, the rest counted.

    >>> places = {}
    >>> merge_quality_places(places, {"imp": {"dense_invalid": {"a.parquet": 3, "b.parquet": 1}}}, keep=1)
    >>> places
    {'imp': {'dense_invalid': {'where': {'a.parquet': 3}, 'more': 1}}}
    """
    for name, rules in by_location.items():
        for rule, places in rules.items():
            entry = into.setdefault(name, {}).setdefault(rule, {"where": {}, "more": 0})
            for where, rows in places.items():
                if where in entry["where"] or len(entry["where"]) < keep:
                    entry["where"][where] = entry["where"].get(where, 0) + rows
                else:
                    entry["more"] += 1


def quality_places_text(places: dict[str, dict[str, Any]], limit: int) -> dict[str, list[str]]:
    """Per rule, ``"<place>: N rows"`` for the first ``limit`` places of one source's ``quality_places``,
    then ``"... and N more"`` when there are others.

    >>> quality_places_text({"dense_invalid": {"where": {"a.parquet": 3, "b.parquet": 1}, "more": 2}}, 1)
    {'dense_invalid': ['a.parquet: 3 rows', '... and 3 more']}
    """
    out: dict[str, list[str]] = {}
    for rule, entry in sorted(places.items()):
        shown = list(entry["where"].items())
        lines = [f"{where}: {rows:,} rows" for where, rows in shown[:limit]]
        more = max(len(shown) - limit, 0) + int(entry["more"])
        out[rule] = lines + ([f"... and {more} more"] if more else [])
    return out


def _record_quality(run: TrainingRun, phase: Phase, driver: DataDriver) -> None:
    """The phase's data-quality counts (rows repaired or dropped per source and rule): added to the run's,
    logged (one warning line per source, naming the files / Kafka offset ranges) and sent to MLflow as
    ``data_quality.<source>.<rule>`` metrics."""
    dataset = run.cfg.job.dataset
    kafka = {source.name for _, source in dataset.all_sources() if source.type == "kafka"}
    quality = driver.quality_counts(offset_sources=kafka)
    phase_places: dict[str, dict[str, dict[str, Any]]] = {}
    merge_quality_places(phase_places, quality["by_location"], QUALITY_PLACES_LOGGED)
    merge_quality_places(run.quality_places, quality["by_location"], QUALITY_PLACES_KEPT)
    for name, counts in quality["by_source"].items():
        mine = run.data_quality.setdefault(name, {})
        for rule, rows in counts.items():
            mine[rule] = mine.get(rule, 0) + rows
        where = "; ".join(
            f"{rule} in {', '.join(lines)}"
            for rule, lines in quality_places_text(phase_places.get(name, {}), QUALITY_PLACES_LOGGED).items()
        )
        log.warning(
            "data quality, phase %s: %s%s",
            phase.name,
            quality_summary(dataset.source(name), counts),
            f" -- {where}" if where else "",
        )
    metrics = {f"data_quality.{n}.{rule}": float(v) for n, c in run.data_quality.items() for rule, v in c.items()}
    if metrics:
        run.tracker.log_metrics(metrics, run.trainer.step if run.trainer is not None else 0)


def _log_pool_timeline(run: TrainingRun, timeline: list[dict[str, Any]], offset_s: float) -> None:
    """The data pool's scaling timeline as MLflow metrics (replicas and utilisation over time), the step
    being seconds since the run started; a point's decision counts in ``data_scaling_decisions``."""
    decisions, points = 0, []
    for point in timeline:
        step = int(offset_s + point["t_s"])
        points += [
            (name, float(point[key]), step) for key, name in _TIMELINE_METRICS.items() if point.get(key) is not None
        ]
        if point.get("decision"):
            decisions += len(str(point["decision"]).split(","))
            points.append(("data_scaling_decisions", float(decisions), step))
    run.tracker.log_metric_points(points)


def train_window(cfg: TrainingRequest, hooks: RunHooks | None = None) -> TrainingResult:
    """Train ``cfg.job``'s model on ``cfg.window`` (see module docstring)."""
    hooks = hooks or RunHooks()
    started = time.perf_counter()
    if cfg.job.pools.training.replicas > 1:
        from primus_dagster.training.multi_trainer import run_multi_trainer_job  # imports this module

        return run_multi_trainer_job(cfg, hooks)
    with Heartbeat() as beat:  # a line in the run log at least every few seconds, whatever the stage
        return _train_window(cfg, hooks, beat, started)


def _train_window(cfg: TrainingRequest, hooks: RunHooks, beat: Heartbeat, started: float) -> TrainingResult:
    job, spec = cfg.job, cfg.job.training
    torch.set_num_threads(spec.threads)
    context = SourceContext(str(cfg.data_root), kafka_bootstrap_servers=cfg.kafka_bootstrap)
    skipped: list[NotReady] = []
    if cfg.tasks is None:
        names = [source.name for _, source in job.dataset.all_sources()]
        beat.stage("planning window %s: listing %d source(s) (%s)", cfg.window, len(names), ", ".join(names))
    tasks = cfg.tasks if cfg.tasks is not None else plan_training_tasks(job, context, cfg.window, skipped)
    beat.stage(planned_line(job, tasks, skipped))
    executors = cfg.executors or job.pools.data.replicas or 1
    tracker = cfg.tracker or MlflowTracker(job.tracking.tracking_uri, job.tracking.experiment)
    tags = {"primus.job": job.name, RUN_KIND_TAG: "window", **cfg.tags}
    if skipped:
        tags["primus.skipped_partitions"] = ", ".join(f"{n.source} {n.partition:%Y-%m-%dT%H:%M}" for n in skipped)[
            :5000
        ]
    beat.stage("MLflow: opening the run %s", cfg.key())
    tracker.start(cfg.key(), params=run_params(job, cfg.window, executors), tags=tags)
    run = TrainingRun(cfg, tracker, tasks)
    run.beat = beat
    status = "FAILED"
    try:
        log.info("MLflow run %s %s: %s", tracker.run_id, "resumed" if tracker.resumed else "started", tracker.run_url)
        inputs = tracker.log_source_inputs(run.consumed)
        log.info("MLflow: %d source dataset(s) recorded as the run's inputs (partitions, versions, offsets)", inputs)
        resume = load_resume(tracker, run)
        warm_from, cold_start = load_warm_start(tracker, run) if resume is None and cfg.warm_start else (None, None)
        all_phases = phases(spec.mode)
        first = 0
        if resume is not None:
            first = phase_index(spec.mode, resume.phase) + (1 if resume.extra.get("phase_done") else 0)
        for phase in all_phases[first:]:
            if not phase_tasks(tasks, phase):
                log.info("phase %s: no tasks, skipped", phase.name)
                continue
            driver = driver_for(cfg, run, phase, resume)
            _run_phase(cfg, run, phase, driver, executors, hooks)
        if run.trainer is None and resume is not None:  # everything was done before the restart
            run.ensure_trainer(int(resume.extra["n_dense"]), int(resume.extra["n_sparse"]))
        if run.trainer is None:
            raise NoTrainingDataError(f"job {job.name}: the window {cfg.window} produced no batches")
        if cfg.evaluate:
            beat.stage("evaluating the model on the %d hour(s) after the window", spec.eval_hours)
        evaluation = evaluate_and_log(cfg, context, run.trainer.model, tracker, run.trainer.step)
        beat.stage("logging the model to MLflow")
        model_uri = tracker.log_model(run.trainer.model)
        log.info("model logged: %s (%.1f s since the start)", model_uri, time.perf_counter() - started)
        status = "FINISHED"
        return training_result(
            run, model_uri, run.trainer.stats(), evaluation, resume, warm_from, cold_start, started, skipped
        )
    except KeyboardInterrupt:  # a cancelled run (SIGINT / SIGTERM through the CLI): MLflow says KILLED
        status = "KILLED"
        raise
    finally:
        tracker.finish(status)
        shutil.rmtree(run.workdir, ignore_errors=True)


def training_result(
    run: TrainingRun,
    model_uri: str | None,
    stats: dict[str, Any],
    evaluation: NextHourEvaluation | None,
    resume: Checkpoint | None,
    warm_from: str | None,
    cold_start: str | None,
    started: float,
    skipped: list[NotReady],
) -> TrainingResult:
    """The result of a finished run (``started``: its ``time.perf_counter()`` at the start)."""
    return TrainingResult(
        run_id=run.tracker.require_run_id(),
        run_url=run.tracker.run_url,
        model_uri=model_uri,
        window=run.cfg.window,
        stats=stats,
        evaluation=evaluation,
        source_versions=run.versions,
        checkpoints=run.checkpoints,
        resumed_from_step=None if resume is None else resume.step,
        warm_started_from=warm_from,
        cold_start=cold_start,
        wall_s=time.perf_counter() - started,
        data_pools=run.data_pools,
        consumed=run.consumed,
        data_quality=run.data_quality,
        data_quality_where={
            name: quality_places_text(places, QUALITY_PLACES_KEPT)
            for name, places in sorted(run.quality_places.items())
        },
        skipped_partitions=[
            {"source": n.source, "partition": n.partition.isoformat(), "reason": n.reason} for n in skipped
        ],
    )


def evaluate_and_log(
    cfg: TrainingRequest, context: SourceContext, model: RecModel, tracker: MlflowTracker, step: int
) -> NextHourEvaluation | None:
    """The next-hour evaluation of ``model`` after ``cfg.window`` (None with ``cfg.evaluate`` off or
    no labelled hours), logged to the run as ``eval_*`` metrics at ``step``."""
    if not cfg.evaluate:
        return None
    end = cfg.window.end
    evaluation = evaluate_window(cfg.job, context, model, end, end + timedelta(hours=cfg.job.training.eval_hours))
    if evaluation is not None:
        values = evaluation.result.to_dict().items()
        tracker.log_metrics({f"eval_{k}": float(v) for k, v in values if isinstance(v, (int, float))}, step)
        tracker.set_tags({"primus.eval_labels": evaluation.labels})
        result = evaluation.result
        log.info("evaluation: AUC %.4f on %d row(s) (%s labels)", result.auc, result.rows, evaluation.labels)
    else:
        log.info("evaluation: no labelled rows after the window")
    return evaluation


def load_warm_start(tracker: MlflowTracker, run: TrainingRun) -> tuple[str | None, str | None]:
    """Load the final checkpoint of the finished run ``run.cfg.warm_start`` (continuous training
    across windows): ``(its run id, None)``. Without one, ``automation.cold_start`` decides: ``allow``
    starts fresh with a warning, ``(None, why)``; otherwise :class:`MissingPredecessorError`."""
    key = run.cfg.warm_start or ""
    source = tracker.finished_run(key)
    directory = tracker.latest_checkpoint(run.workdir / "warm", run_id=source) if source else None
    if directory is None:
        why = f"no finished run {key!r} with a checkpoint to warm-start from"
        if run.cfg.job.automation.cold_start != "allow":
            raise MissingPredecessorError(
                f"job {run.cfg.job.name}: {why}: windows train in order, each continuing the model of the one "
                "before it; train that window first, or set automation.cold_start: allow to start afresh"
            )
        log.warning("%s: the model starts fresh (automation.cold_start: allow)", why)
        tracker.set_tags({"primus.cold_start": why})
        return None, why
    run.warm = load_checkpoint(directory)
    tracker.set_tags({"primus.warm_start": source})
    log.info("warm start from run %s (%s, step %d)", source, key, run.warm.step)
    return source, None


def load_resume(tracker: MlflowTracker, run: TrainingRun) -> Checkpoint | None:
    """The latest checkpoint of a resumed (killed) run, set as ``run.pending``; None for a new run."""
    if not tracker.resumed:
        return None
    directory = tracker.latest_checkpoint(run.workdir / "resume")
    if directory is None:
        return None
    checkpoint = load_checkpoint(directory)
    run.pending = checkpoint
    # the quality counts of the phases finished before the kill (older checkpoints: none kept)
    run.data_quality = {k: dict(v) for k, v in (checkpoint.extra.get("data_quality") or {}).items()}
    run.quality_places = json.loads(json.dumps(checkpoint.extra.get("data_quality_places") or {}))
    log.info(
        "resuming run %s from its checkpoint at step %d (phase %s)", tracker.run_id, checkpoint.step, checkpoint.phase
    )
    return checkpoint

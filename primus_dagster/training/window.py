"""One window run, for any trainer: plan -> MLflow run -> phases on data planes -> evaluation -> model.

:func:`train_window` trains a job's model on one data window, whoever trains it:

1. DTGG plans the window (``planning``); the tasks' source versions (Delta version, Iceberg
   snapshot, Kafka offsets) are recorded.
2. The MLflow run for the request's run key is started -- or resumed: a run with that key that did
   not finish (a killed trainer leaves it RUNNING) continues from its latest checkpoint; a
   ``warm_start`` run key continues a finished run's model. The whole run holds the run key's lock
   (:mod:`~primus_dagster.training.run_lock`): a second run of the key fails at once, naming the first.
3. Each phase of the mode (``modes``) gets a data driver (restored from the latest checkpoint's
   snapshot when it was taken in that phase) and a data plane (``RunHooks.data_plane``, else what
   ``pools.backend`` picks); the :class:`PhaseTrainer` trains the phase on it and checkpoints (model,
   optimizer, counters, the driver's barrier snapshot, source versions) every
   ``checkpoint_every_steps`` steps and at the phase's end. The plane's summary, scaling timeline and
   data-quality counts are recorded per phase. A trainer whose failure is restartable
   (:class:`~primus_dagster.training.phase_trainer.TrainerFailedError`) starts again from the latest
   checkpoint while ``pools.training.restart`` allows.
4. The final model is evaluated on the hours after the window (next-hour AUC / log loss) and logged
   with ``mlflow.pytorch``; the :class:`~primus_dagster.training.result.TrainingResult` says what the
   run did.

The skeleton knows its trainer only as a :class:`~primus_dagster.training.phase_trainer.PhaseTrainer`
(:func:`~primus_dagster.training.trainers.phase_trainer` picks one: a trainer in this process, or a group
of rank processes; both train with the one phase loop, :mod:`primus_dagster.training.loop`). The skeleton
and its diagram: ``docs/training.md``.

Example::

    result = train_window(TrainingRequest(job, "job.yaml", "/data", TimeWindow(t0, t0 + timedelta(hours=24))))
    result.evaluation.result.auc, result.run_id, result.model_uri
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import shutil
import time
from datetime import timedelta
from typing import Any

import torch

from primus_dagster.cluster.backends import data_plane_starter
from primus_dagster.cluster.pool import memory_bytes
from primus_dagster.data import (
    DataDriver,
    DataFailedError,
    DataTask,
    NotReady,
    PermanentDataError,
    SourceContext,
    TimeWindow,
    declared_schema,
    pack_failure,
    read_batches,
    read_location,
)
from primus_dagster.spec import JobSpec
from primus_dagster.spec.job import TrainingSpec
from primus_dagster.training.checkpoint import Checkpoint, load_checkpoint
from primus_dagster.training.device import resolve_device
from primus_dagster.training.evaluation import NextHourEvaluation, evaluate_window
from primus_dagster.training.failed_tasks import (
    FailedTasksError,
    failed_tasks_allowed,
    not_allowed_why,
    offset_sources,
    record_failed_tasks,
)
from primus_dagster.training.features import ModelInit, fit_dense_stats
from primus_dagster.training.loop import checkpoint_ranks
from primus_dagster.training.memory_plan import MemoryPlan, plan_memory
from primus_dagster.training.models import RecModel, check_model, custom_model_line, model_summary
from primus_dagster.training.modes import Phase, phase_tasks, phases
from primus_dagster.training.phase_trainer import PhaseTrainer, TrainerFailedError
from primus_dagster.training.planning import (
    NO_ROWS,
    EmptyPartition,
    NoTrainingDataError,
    empty_partitions_line,
    plan_training_tasks,
    planned_line,
)
from primus_dagster.training.priority import LoadingPriority
from primus_dagster.training.progress import Heartbeat
from primus_dagster.training.quality_report import add_phase_quality, record_quality
from primus_dagster.training.result import TrainingResult, build_result
from primus_dagster.training.run_lock import RunLock
from primus_dagster.training.run_state import CheckpointRef, RunHooks, TrainingRequest, TrainingRun
from primus_dagster.training.tracking import RUN_KIND_TAG, MlflowTracker
from primus_dagster.training.trainers import phase_trainer

log = logging.getLogger(__name__)


class MissingPredecessorError(RuntimeError):
    """The run should continue the model of the window before it (``warm_start``), which has no finished
    model, and ``automation.cold_start`` does not allow a fresh start."""


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
        "device": t.device,
        "priority_weights": job.kind_weights(),
        "batch_lag": str(t.batch_lag),
        "window_start": window.start.isoformat(),
        "window_end": window.end.isoformat(),
        "data_executors": executors,
    }


def train_window(
    request: TrainingRequest, hooks: RunHooks | None = None, *, trainer: PhaseTrainer | None = None
) -> TrainingResult:
    """Train ``request.job``'s model on ``request.window`` (module docstring); ``trainer``: who trains
    the phases (default :func:`~primus_dagster.training.trainers.phase_trainer`)."""
    hooks = hooks or RunHooks()
    trainer = trainer or phase_trainer(request.job, hooks)
    started = time.perf_counter()
    tracker = request.tracker or MlflowTracker(request.job.tracking.tracking_uri, request.job.tracking.experiment)
    # one run per run key and MLflow store: a second one fails here, naming the first (run_lock)
    with RunLock(request.key(), tracker.tracking_uri, tracker.experiment) as lock, Heartbeat() as beat:
        return _train(request, hooks, trainer, beat, started, tracker, lock)


def _train(
    request: TrainingRequest,
    hooks: RunHooks,
    trainer: PhaseTrainer,
    beat: Heartbeat,
    started: float,
    tracker: MlflowTracker,
    lock: RunLock,
) -> TrainingResult:
    job, spec = request.job, request.job.training
    torch.set_num_threads(spec.threads)  # this process: training (one trainer) and evaluation
    device, device_line = resolve_device(spec.device, trainers=trainer.trainers)  # no GPU: an error before any work
    beat.stage("device: %s", device_line)
    context = SourceContext(str(request.data_root), kafka_bootstrap_servers=request.kafka_bootstrap)
    skipped: list[NotReady] = []
    empty: list[EmptyPartition] = []
    if request.tasks is None:
        names = [source.name for _, source in job.dataset.all_sources()]
        beat.stage("planning window %s: listing %d source(s) (%s)", request.window, len(names), ", ".join(names))
    tasks = request.tasks
    if tasks is None:
        tasks = plan_training_tasks(
            job, context, request.window, skipped, complete_window=request.complete_window, empty=empty
        )
    beat.stage(planned_line(job, tasks, skipped))
    executors = request.executors or job.pools.data.replicas or 1
    extra_params, extra_tags = trainer.describe()
    tags = {**job.tags, "primus.job": job.name, RUN_KIND_TAG: "window", **extra_tags, **request.tags}
    if job.owners:
        tags["primus.owners"] = ", ".join(job.owners)
    if skipped:
        tags["primus.skipped_partitions"] = ", ".join(f"{n.source} {n.partition:%Y-%m-%dT%H:%M}" for n in skipped)[
            :5000
        ]
    for advice in job.advisories():
        log.warning("spec: %s", advice)
    beat.stage("MLflow: opening the run %s", request.key())
    tracker.start(request.key(), params={**run_params(job, request.window, executors), **extra_params}, tags=tags)
    lock.record_run(tracker.require_run_id())  # a refused second run names it
    run = TrainingRun(request, tracker, tasks, beat, device)
    run.empty_partitions = empty
    status = "FAILED"
    try:
        log.info("MLflow run %s %s: %s", tracker.run_id, "resumed" if tracker.resumed else "started", tracker.run_url)
        schemas = {name: declared_schema(job.dataset.source(name).columns) for name in run.consumed}
        inputs = tracker.log_source_inputs(run.consumed, schemas=schemas)
        log.info("MLflow: %d source dataset(s) recorded as the run's inputs (partitions, versions, offsets)", inputs)
        resume = load_resume(tracker, run)
        warm_from, cold_start = load_warm_start(tracker, run) if resume is None and request.warm_start else (None, None)
        run.model_init = model_init(run, context, resume)
        run.memory_plan = memory_plan(run)
        _run_phases(run, trainer, hooks, executors)
        model, step = trainer.final_model(run)
        tracker.set_tags({"primus.model": str(model_summary(model))})
        if request.evaluate:
            beat.stage("evaluating the model on the %d hour(s) after the window", spec.eval_hours)
        evaluation = evaluate_and_log(request, context, model, tracker, step)
        beat.stage("logging the model to MLflow")
        model_uri = tracker.log_model(model.cpu())  # a registered model loads on any machine
        log.info("model logged: %s (%.1f s since the start)", model_uri, time.perf_counter() - started)
        stats = trainer.stats(run)
        if run.empty_partitions:
            named = ", ".join(f"{e.source} {e.partition:%Y-%m-%dT%H:%M}" for e in run.empty_partitions)
            tracker.set_tags({"primus.empty_partitions": named[:5000]})
        status = "FINISHED"
        return build_result(run, model_uri, stats, evaluation, resume, warm_from, cold_start, started, skipped)
    except BaseException as exc:
        # Interrupted, not failed: SIGINT / SIGTERM through the CLI (KeyboardInterrupt), a host's interruption
        # (Dagster's Terminate raises its own BaseException in the step): MLflow says KILLED.
        if not isinstance(exc, Exception):
            status = "KILLED"
        raise
    finally:
        tracker.finish(status)
        shutil.rmtree(run.workdir, ignore_errors=True)


def _run_phases(run: TrainingRun, trainer: PhaseTrainer, hooks: RunHooks, executors: int) -> None:
    """The phases from the latest checkpoint on; a restartable trainer that failed starts again from the
    latest checkpoint while ``pools.training`` allows restarts."""
    pool, restarts = run.job.pools.training, 0
    while True:
        try:
            for phase in phases(run.spec.mode)[run.first_phase() :]:
                if not phase_tasks(run.tasks, phase):
                    log.info("phase %s: no tasks, skipped", phase.name)
                    continue
                driver = driver_for(run, phase, trainers=trainer.trainers)
                _run_phase(run, trainer, hooks, phase, driver, executors)
            return
        except TrainerFailedError as exc:
            if not exc.restartable or pool.restart == "never" or restarts >= pool.max_restarts:
                raise
            restarts += 1
            where = f"the checkpoint at step {run.latest.step}" if run.latest is not None else "the start"
            log.warning(
                "%s\nrestarting the trainer group from %s (restart %d of %d)", exc, where, restarts, pool.max_restarts
            )


def driver_for(run: TrainingRun, phase: Phase, trainers: int = 1) -> DataDriver:
    """The data driver of ``phase`` serving ``trainers`` readers: restored from the run's latest
    checkpoint when it was taken in this phase, else fresh with the phase's tasks."""
    checkpoint = run.checkpoint_in(phase.name)
    if checkpoint is not None and checkpoint.data_snapshot is not None:
        driver = DataDriver.restore(checkpoint.data_snapshot, trainers=trainers)
        log.info("phase %s: data progress restored from the checkpoint at step %d", phase.name, checkpoint.step)
    else:
        driver = DataDriver.for_job(run.job.data, trainers=trainers)
        driver.add_tasks(phase_tasks(run.tasks, phase))
    driver.source_versions = dict(run.versions)
    return driver


def _run_phase(
    run: TrainingRun, trainer: PhaseTrainer, hooks: RunHooks, phase: Phase, driver: DataDriver, executors: int
) -> None:
    """One phase: the data plane on ``driver``, the trainer on it, then what the pool did, the tasks the
    driver gave up (``failed_tasks``; where the run allows none, the first one fails it: a
    :class:`FailedTasksError` naming the files) and the phase's quality counts."""
    request = run.request
    allowed = failed_tasks_allowed(request)
    if not allowed:
        driver.failed_task_threshold = 0.0  # the first task given up fails the phase at once
    # Both kinds live: q_i weighs the serving buffers; the driver leases to the kind furthest below its share.
    driver.loading_policy = LoadingPriority(run.job.kind_weights()) if phase.prioritised else None
    start_plane = hooks.data_plane or data_plane_starter(run.job, run_id=request.key())
    run.stage(
        "phase %s: %d task(s) to read; starting %d data executor(s)",
        phase.name,
        sum(driver.backlog_by_kind().values()),
        executors,
    )
    try:
        with start_plane(
            request.job_path,
            request.data_root,
            driver=driver,
            executors=executors,
            trainers=trainer.trainers,
            token=secrets.token_hex(16),
            kafka_bootstrap=request.kafka_bootstrap,
        ) as plane:
            trainer.train_phase(run, phase, plane)
            pool = plane.summary()
            log_pool_timeline(run, pool.pop("timeline", []), plane.started_at - run.started)
            if isinstance(pool.get("scaling"), dict):
                pool["scaling"] = {k: v for k, v in pool["scaling"].items() if k != "timeline"}
            run.data_pools[phase.name] = pool  # the timeline is in MLflow, as metrics
            plane.driver.raise_if_failed()
    except DataFailedError as exc:  # past the threshold, or any task where none is allowed
        rows = record_failed_tasks(run, phase, driver, step=trainer.step)
        if allowed or not rows:
            raise
        raise FailedTasksError(rows, exc.total, not_allowed_why(request)) from exc
    record_failed_tasks(run, phase, driver, step=trainer.step)
    record_quality(run, phase, driver, step=trainer.step)
    record_empty_partitions(run, phase, driver)


def record_empty_partitions(run: TrainingRun, phase: Phase, driver: DataDriver) -> None:
    """The partitions ``phase`` read whose every task served no row: named in a warning, kept on the run
    (the result's ``empty_partitions``, beside those that had nothing to read when planned)."""
    known = {(e.source, e.partition) for e in run.empty_partitions}
    found = [
        EmptyPartition(source, partition, NO_ROWS)
        for (source, partition), rows in sorted(driver.rows_by_partition().items(), key=lambda kv: kv[0][::-1])
        if rows == 0 and (source, partition) not in known
    ]
    if found:
        log.warning("phase %s: %d partition(s) held no rows: %s", phase.name, len(found), empty_partitions_line(found))
        run.empty_partitions += found


_TIMELINE_METRICS = {
    "replicas": "data_replicas",
    "target_replicas": "data_target_replicas",
    "cpu_util": "data_cpu_util",
    "memory_util": "data_memory_util",
    "load": "data_load",
}


def log_pool_timeline(run: TrainingRun, timeline: list[dict[str, Any]], offset_s: float) -> None:
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


def evaluate_and_log(
    request: TrainingRequest, context: SourceContext, model: RecModel, tracker: MlflowTracker, step: int
) -> NextHourEvaluation | None:
    """The next-hour evaluation of ``model`` after ``request.window`` (None with ``request.evaluate`` off
    or no labelled hours), logged to the run as ``eval_*`` metrics at ``step``."""
    if not request.evaluate:
        return None
    end = request.window.end
    evaluation = evaluate_window(
        request.job,
        context,
        model,
        end,
        end + timedelta(hours=request.job.training.eval_hours),
        train_start=request.window.start,
    )
    if evaluation is not None:
        values = evaluation.result.to_dict().items()
        metrics = {f"eval_{k}": float(v) for k, v in values if isinstance(v, (int, float))}
        tags = {"primus.eval_labels": evaluation.labels, "primus.baseline_verdict": evaluation.verdict_text()[:5000]}
        if evaluation.baseline is not None:
            metrics["eval_popularity_auc"] = float(evaluation.baseline.popularity_auc)
            tags["primus.popularity_feature"] = evaluation.baseline.popularity_feature
        tracker.log_metrics(metrics, step)
        tracker.set_tags(tags)
        result = evaluation.result
        log.info("evaluation: AUC %.4f on %d row(s) (%s labels)", result.auc, result.rows, evaluation.labels)
        log.info("quality: %s", evaluation.verdict_text())
    else:
        log.info("evaluation: no labelled rows after the window")
    return evaluation


def model_init(run: TrainingRun, context: SourceContext, resume: Checkpoint | None) -> ModelInit:
    """The feature layout (and dense statistics) the run's model is built on: a resumed model's own;
    else the layout of the first planned tasks' data (read here, in plan order: the first phase's
    tasks, the same rows on every trainer rank) and, for a fresh model, the statistics of its first
    ``training.features.stats_rows`` rows (a warm-started model has its statistics in its weights)."""
    spec = run.spec
    if resume is not None:
        return _checked(spec, ModelInit.of_checkpoint(resume.extra, spec.model))
    first = next((phase_tasks(run.tasks, p) for p in phases(spec.mode) if phase_tasks(run.tasks, p)), [])
    rows = 1 if run.warm is not None else spec.features.stats_rows
    run.stage("features: reading the first %d row(s) of the window for the layout and dense statistics", rows)
    started = time.perf_counter()

    def unreadable(task: DataTask, exc: Exception) -> None:  # the data plane retries it and reports it
        if isinstance(exc, PermanentDataError):  # data that does not fit its spec: every file would fail alike
            raise exc
        failure = pack_failure(exc)  # one file of a pack: the pack's other files are read without it
        where = (
            failure.member if failure else read_location(task.read, offsets=task.read.source in offset_sources(run.job))
        )
        log.warning("features: %s could not be read (%s: %s); its rows are left out of the statistics",
                    where, type(exc).__name__, (str(exc).splitlines() or [""])[0][:300])  # fmt: skip

    batches = read_batches(run.job, context, first, on_error=unreadable)
    try:
        head = next(batches, None)
        if head is None:
            raise NoTrainingDataError(f"job {run.job.name}: the window {run.request.window} produced no batches")
        shape = ModelInit.of_batch(spec, run.job.dataset.source(head.source).columns, head)
        stats = fit_dense_stats(shape.layout, itertools.chain([head], batches), rows) if run.warm is None else None
    finally:
        batches.close()
    init = ModelInit(shape.layout, stats)
    layout = init.layout
    log.info(
        "features: %d dense (%s), %d id and %d list feature(s) in %d table(s) (%s); dense statistics of %d row(s) "
        "(%.1f s)%s",
        layout.n_dense,
        ", ".join(f"{c.name}: {c.transform}" for c in layout.dense) or "none",
        layout.n_sparse,
        len(layout.lists),
        len(layout.tables),
        ", ".join(f"{name} {b:,}x{d}" for name, (b, d) in layout.tables.items()) or "none",
        stats.rows if stats is not None else 0,
        time.perf_counter() - started,
        "; a warm start keeps its model's" if stats is None else "",
    )
    run.tracker.log_dict(init.to_dict(), "features.json")
    return _checked(spec, init)


def memory_plan(run: TrainingRun) -> MemoryPlan:
    """The run's trainers' memory and table sharding on its layout (:mod:`~primus_dagster.training.memory_plan`),
    said in the run log and the MLflow run; :class:`~primus_dagster.training.memory_plan.MemoryPlanError`
    before any trainer starts when the model does not fit ``pools.training.memory``."""
    assert run.model_init is not None
    pool = run.job.pools.training
    plan = plan_memory(run.spec, pool, run.model_init.layout, limit_bytes=memory_bytes(pool.memory))
    log.info("%s", plan.line())
    run.tracker.set_tags({"primus.sharding": plan.sharding})
    return plan


def _checked(spec: TrainingSpec, init: ModelInit) -> ModelInit:
    """``init`` after a custom model was built on it and ran two made-up rows (a factory or module that
    breaks the protocol fails here, naming itself, before any trainer starts); likewise an MTRM over a
    team's towers."""
    if spec.model.factories():
        log.info("model: %s", custom_model_line(check_model(spec.model, init.layout, spec.loss)))
    return init


def load_warm_start(tracker: MlflowTracker, run: TrainingRun) -> tuple[str | None, str | None]:
    """Load the final checkpoint of the finished run ``run.request.warm_start`` (continuous training
    across windows) as ``run.warm``: ``(its run id, None)``. Without one, ``automation.cold_start``
    decides: ``allow`` starts fresh with a warning, ``(None, why)``; otherwise
    :class:`MissingPredecessorError`."""
    key = run.request.warm_start or ""
    source = tracker.finished_run(key)
    directory = tracker.latest_checkpoint(run.workdir / "warm", run_id=source) if source else None
    if directory is None:
        why = f"no finished run {key!r} with a checkpoint to warm-start from"
        if run.job.automation.cold_start != "allow":
            raise MissingPredecessorError(
                f"job {run.job.name}: {why}: windows train in order, each continuing the model of the one "
                "before it; train that window first, or set automation.cold_start: allow to start afresh"
            )
        log.warning("%s: the model starts fresh (automation.cold_start: allow)", why)
        tracker.set_tags({"primus.cold_start": why})
        return None, why
    run.warm, run.warm_path = load_checkpoint(directory), directory
    tracker.set_tags({"primus.warm_start": source})
    log.info("warm start from run %s (%s, step %d)", source, key, run.warm.step)
    return source, None


def load_resume(tracker: MlflowTracker, run: TrainingRun) -> Checkpoint | None:
    """The latest checkpoint of a resumed (killed) run, made the run's latest; None for a new run."""
    if not tracker.resumed:
        return None
    directory = tracker.latest_checkpoint(run.workdir / "resume")
    if directory is None:
        return None
    checkpoint = load_checkpoint(directory)
    phase_done = bool(checkpoint.extra.get("phase_done"))
    run.latest = CheckpointRef(checkpoint.step, checkpoint.phase, phase_done, directory, checkpoint_ranks(checkpoint))
    # the quality counts of the phases finished before the kill (older checkpoints: none kept), and of the
    # phase the checkpoint closed (its driver's final snapshot)
    run.data_quality = {k: dict(v) for k, v in (checkpoint.extra.get("data_quality") or {}).items()}
    run.quality_places = json.loads(json.dumps(checkpoint.extra.get("data_quality_places") or {}))
    if phase_done and checkpoint.data_snapshot is not None:
        add_phase_quality(run, DataDriver.restore(checkpoint.data_snapshot))
    log.info(
        "resuming run %s from its checkpoint at step %d (phase %s)", tracker.run_id, checkpoint.step, checkpoint.phase
    )
    return checkpoint

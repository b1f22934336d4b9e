"""The clock-driven alternative to the sensors: a schedule of the training partitions, hourly or daily.

:func:`build_schedules` builds the schedule of the partitioned asset job of the training asset: each
hour (``training.partition: hour``) or day (``day``) it materialises the training partition that has just
closed, at an offset of the largest ``label_delay`` of the stream sources (so that the stream copy of the
window is complete; the offset is capped just below one partition, as a schedule always targets the
partition that ended last). It is what ``build_schedule_from_partitioned_job`` builds, written out: in
Dagster 1.13 that helper calls its own deprecated ``run_request_for_partition`` at every tick.

Schedules suit data that lands on time. A schedule does not look at the data: a window whose inputs are
late fails (no ready data), and one whose predecessor was not trained fails or starts fresh as
``automation.cold_start`` says. The sensors (:mod:`~primus_dagster.dagster_defs.sensors`) wait for the
inputs instead and are what the reference deployment turns on; the schedule is defined there stopped, to
be turned on in the UI (or ``dagster schedule start``) where a fixed clock is wanted. Source assets get
no schedule: their data lands on the storage system's clock, which the batch sensor follows.

The second schedule, ``<job>_auc_final_schedule``, runs the delayed final evaluation: each hour, at
the minute the labels of a training partition's held-out hours complete (window end + ``eval_hours`` +
the label delay, :func:`~primus_dagster.training.evaluation.labels_complete_at`), a check-only run of
the training asset's ``auc_final`` check (:func:`auc_final_job`) for the newest partition whose labels
are complete (one run per partition: the run key). Partitions it did not catch (the schedule was
stopped) are scored by launching ``<job>_auc_final_job`` with the run tag ``dagster/partition`` set to the
partition (the check is partitioned as its asset: each evaluation is listed under its partition).

Example::

    schedules = build_schedules(job)       # [ctr_demo_training_schedule, ctr_demo_auc_final_schedule], STOPPED
    defs = build_definitions(job, job_path="job.yaml", schedules=schedules)
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetSelection,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    define_asset_job,
    schedule,
)

from primus_dagster.dagster_defs.training_asset import (
    AUC_FINAL_CHECK_NAME,
    latest_complete_partition,
    training_asset_name,
    training_partitions_def,
)
from primus_dagster.run_queue import RUN_KIND_TAG
from primus_dagster.spec import JobSpec, granularity_step
from primus_dagster.training.final_eval import labels_complete_at

AssetJob = Any
"""What ``define_asset_job`` returns (an unresolved asset job; Dagster does not export its class)."""
_TRAINING_JOBS: dict[tuple[str, AssetKey, str], AssetJob] = {}


def schedule_offset(job: JobSpec) -> timedelta:
    """How long after a training window closes its schedule fires: the largest stream-source
    ``label_delay``, in whole minutes, capped one minute below the partition length."""
    delays = [s.label_delay for _, s in job.dataset.all_sources() if s.kind == "stream"]
    minutes = math.ceil(max(delays, default=timedelta(0)) / timedelta(minutes=1))
    cap = granularity_step(job.training.partition) - timedelta(minutes=1)
    return min(timedelta(minutes=minutes), cap)


def training_asset_job(job: JobSpec, key_prefix: list[str] | None = None) -> AssetJob:
    """``<job>_training_job``: the partitioned asset job of the training asset (the schedule's and the
    sensors' target: one object per job and prefix, as Dagster refuses two definitions of one job)."""
    key = AssetKey([*(key_prefix or []), training_asset_name(job)])
    name = f"{job.name.replace('-', '_')}_training_job"
    cache_key = (name, key, job.training.partition)
    if cache_key not in _TRAINING_JOBS:
        _TRAINING_JOBS[cache_key] = define_asset_job(
            name,
            # Its blocking check runs with it; auc_final waits for complete labels and has its own job.
            selection=AssetSelection.assets(key) - AssetSelection.checks(AssetCheckKey(key, AUC_FINAL_CHECK_NAME)),
            description=f"The training partitions of job `{job.name}`, one per {job.training.partition}.",
            run_tags={RUN_KIND_TAG: "training"},  # one at a time in the local run queue (run_queue.py)
        )
    return _TRAINING_JOBS[cache_key]


def auc_final_job(job: JobSpec, key_prefix: list[str] | None = None) -> AssetJob:
    """``<job>_auc_final_job``: a check-only job running the training asset's ``auc_final`` check."""
    key = AssetKey([*(key_prefix or []), training_asset_name(job)])
    name = f"{job.name.replace('-', '_')}_auc_final_job"
    cache_key = (name, key, AUC_FINAL_CHECK_NAME)
    if cache_key not in _TRAINING_JOBS:
        _TRAINING_JOBS[cache_key] = define_asset_job(
            name,
            selection=AssetSelection.checks(AssetCheckKey(key, AUC_FINAL_CHECK_NAME)),
            description=f"The final AUC of a training partition of job `{job.name}`, on complete labels.",
            run_tags={RUN_KIND_TAG: "check"},
        )
    return _TRAINING_JOBS[cache_key]


def build_schedules(
    job: JobSpec,
    key_prefix: list[str] | None = None,
    default_status: DefaultScheduleStatus = DefaultScheduleStatus.STOPPED,
) -> list[ScheduleDefinition]:
    """The training schedule and the ``auc_final`` schedule of ``job`` (module docstring), in a list as
    ``build_definitions`` takes it (which defines the ``auc_final`` check they need)."""
    offset = schedule_offset(job)
    hours, minutes = divmod(int(offset / timedelta(minutes=1)), 60)
    partitions = training_partitions_def(job)
    cron = f"{minutes} {hours} * * *" if job.training.partition == "day" else f"{minutes} * * * *"

    @schedule(
        name=f"{job.name.replace('-', '_')}_training_schedule",
        cron_schedule=cron,
        execution_timezone="UTC",
        job=training_asset_job(job, key_prefix),
        default_status=default_status,
        description=f"Each {job.training.partition}, {offset} after it closes: train job `{job.name}`'s partition.",
    )
    def _training_schedule(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
        closed = partitions.get_partition_keys(current_time=context.scheduled_execution_time)
        if not closed:
            return SkipReason("no training partition has closed yet")
        key = closed[-1]
        return RunRequest(run_key=key, partition_key=key, tags={"primus/trigger": "training schedule"})

    final_minute = int((labels_complete_at(job, job.dataset.start) - job.dataset.start) / timedelta(minutes=1)) % 60

    @schedule(
        name=f"{job.name.replace('-', '_')}_auc_final_schedule",
        cron_schedule=f"{final_minute} * * * *",
        execution_timezone="UTC",
        job=auc_final_job(job, key_prefix),
        default_status=default_status,
        description=f"Each hour: the final AUC of job `{job.name}`'s newest partition whose labels are complete.",
    )
    def _auc_final_schedule(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
        now = context.scheduled_execution_time
        key = latest_complete_partition(job, partitions, now) if now is not None else None
        if key is None:
            return SkipReason("no training partition has complete labels yet")
        # The partition as a tag: Dagster 1.13 gives a check-only job no partitions of its own (a request's
        # partition_key fails there), yet a run tagged with one runs its partitioned check for that partition.
        return RunRequest(
            run_key=f"auc_final/{key}", tags={"dagster/partition": key, "primus/trigger": "auc_final schedule"}
        )

    return [_training_schedule, _auc_final_schedule]

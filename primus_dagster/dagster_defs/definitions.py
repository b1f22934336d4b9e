"""The ``Definitions`` of one job: its source assets (with their checks), its training asset, resources.

Example::

    defs = build_definitions("examples/job.yaml")                      # embedded default resources
    defs = build_definitions(job, job_path="job.yaml", resources={...}, sensors=[...], extra_assets=[report])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dagster import AssetsDefinition, Definitions, ExecutorDefinition, ScheduleDefinition, SensorDefinition

from primus_dagster.dagster_defs.live_asset import build_live_asset
from primus_dagster.dagster_defs.resources import default_resources
from primus_dagster.dagster_defs.schedules import auc_final_job
from primus_dagster.dagster_defs.source_assets import build_source_assets
from primus_dagster.dagster_defs.training_asset import build_auc_final_check, build_training_asset
from primus_dagster.spec import JobSpec, load_job_spec


def build_definitions(
    job: JobSpec | str | Path,
    resources: Mapping[str, Any] | None = None,
    sensors: Sequence[SensorDefinition] = (),
    schedules: Sequence[ScheduleDefinition] = (),
    job_path: str | Path | None = None,
    extra_assets: Sequence[AssetsDefinition] = (),
    executor: ExecutorDefinition | None = None,
) -> Definitions:
    """Source assets of ``job``, its training asset (with its delayed ``auc_final`` check and the check-only
    ``<job>_auc_final_job``) and its live model asset (a job with a Kafka stream to follow), plus
    ``extra_assets`` (a user's own, e.g. downstream of the model), with ``resources`` (default: :func:`default_resources`). The training
    asset needs the spec's file (executor processes load it): ``job`` given as a path, or ``job_path``
    when ``job`` is a loaded spec (without it: source assets only). ``executor``: how runs execute their
    steps (default: Dagster's multiprocess executor; e.g. dagster-k8s's ``k8s_job_executor``)."""
    if not isinstance(job, JobSpec):
        job_path = job_path or job
        job = load_job_spec(job)
    job_assets = build_source_assets(job)
    checks, jobs = [], []
    if job_path is not None:
        job_assets.append(build_training_asset(job, job_path))
        checks.append(build_auc_final_check(job))
        jobs.append(auc_final_job(job))  # launched by its schedule, or by hand with a `partition`
        if job.live_stream_sources()[0]:
            job_assets.append(build_live_asset(job, job_path))
    return Definitions(
        assets=[*job_assets, *extra_assets],
        asset_checks=checks,
        jobs=jobs,
        resources=dict(resources) if resources is not None else default_resources(),
        sensors=list(sensors),
        schedules=list(schedules),
        executor=executor,
    )

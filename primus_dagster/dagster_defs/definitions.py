"""Build a Dagster ``Definitions`` object from a job spec file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from dagster import Definitions

from primus_dagster.dagster_defs.resources import default_resources
from primus_dagster.dagster_defs.source_assets import build_source_assets
from primus_dagster.dagster_defs.training_asset import build_training_asset
from primus_dagster.spec import JobSpec, load_job_spec


def build_definitions(
    job: JobSpec | str | Path,
    resources: dict[str, Any] | None = None,
    sensors: Sequence[Any] = (),
    schedules: Sequence[Any] = (),
    job_path: str | Path | None = None,
) -> Definitions:
    """Source assets of ``job`` and its training asset, plus the given resources (default: embedded
    defaults). The training asset needs the spec's file (executor processes load it): given as a
    path, or ``job_path`` when ``job`` is a loaded spec (without it: source assets only).

    >>> defs = build_definitions("examples/job.yaml")  # doctest: +SKIP
    """
    if not isinstance(job, JobSpec):
        job_path = job_path or job
        job = load_job_spec(job)
    assets = [*build_source_assets(job)]
    if job_path is not None:
        assets.append(build_training_asset(job, job_path))
    return Definitions(
        assets=assets,
        resources=resources if resources is not None else default_resources(),
        sensors=list(sensors),
        schedules=list(schedules),
    )

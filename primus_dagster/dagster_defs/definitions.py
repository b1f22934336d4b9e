"""Build a Dagster ``Definitions`` object from a job spec file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from dagster import Definitions

from primus_dagster.dagster_defs.resources import default_resources
from primus_dagster.dagster_defs.source_assets import build_source_assets
from primus_dagster.spec import JobSpec, load_job_spec


def build_definitions(
    job: JobSpec | str | Path,
    resources: dict[str, Any] | None = None,
    sensors: Sequence[Any] = (),
    schedules: Sequence[Any] = (),
) -> Definitions:
    """Source assets of ``job`` plus the given resources (default: embedded defaults).

    >>> defs = build_definitions("examples/job.yaml")  # doctest: +SKIP
    """
    if not isinstance(job, JobSpec):
        job = load_job_spec(job)
    return Definitions(
        assets=build_source_assets(job),
        resources=resources if resources is not None else default_resources(),
        sensors=list(sensors),
        schedules=list(schedules),
    )

"""The ``Definitions`` of one job: its source assets (with their checks), its training asset, resources.

Example::

    defs = build_definitions("examples/job.yaml")                      # embedded default resources
    defs = build_definitions(job, job_path="job.yaml", resources={...}, sensors=[...], extra_assets=[report])
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dagster import (
    AssetsDefinition,
    AssetSpec,
    BetaWarning,
    CodeReferencesMetadataValue,
    Definitions,
    ExecutorDefinition,
    LocalFileCodeReference,
    ScheduleDefinition,
    SensorDefinition,
    map_asset_specs,
    with_source_code_references,
)

from primus_dagster.dagster_defs.live_asset import build_live_asset
from primus_dagster.dagster_defs.resources import default_resources
from primus_dagster.dagster_defs.schedules import auc_final_job
from primus_dagster.dagster_defs.source_assets import build_source_assets
from primus_dagster.dagster_defs.training_asset import build_auc_final_check, build_training_asset
from primus_dagster.spec import JobSpec, load_job_spec

CODE_REFERENCES = "dagster/code_references"


def with_code_references(
    assets: Sequence[AssetsDefinition], spec_path: str | Path | None = None
) -> list[AssetsDefinition]:
    """``assets`` with Dagster's code references (``dagster/code_references``, links in the UI): the file and
    line of each asset's function and, with ``spec_path``, the job spec it was built from (label ``job spec``);
    assets that have references already are left as they are. Dagster 1.13 (pinned in constraints.txt) marks
    ``with_source_code_references`` and the code reference values as beta and warns at every definitions
    load; that warning is silenced here only (as partitions.py does for its preview warning), and the
    references are asserted by tests/dagster_defs/test_asset_metadata.py. No links to a git host
    (``link_code_references_to_git``): it needs a remote URL and branch a checkout need not have; local file
    references work wherever the code location runs."""

    def add_spec(spec: AssetSpec) -> AssetSpec:
        references = [
            *spec.metadata[CODE_REFERENCES].code_references,
            LocalFileCodeReference(file_path=str(Path(spec_path).resolve()), label="job spec"),
        ]
        return spec.replace_attributes(
            metadata={**spec.metadata, CODE_REFERENCES: CodeReferencesMetadataValue(code_references=references)}
        )

    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        for asset in assets:
            if isinstance(asset, AssetsDefinition) and not any(
                CODE_REFERENCES in metadata for metadata in asset.metadata_by_key.values()
            ):
                (asset,) = with_source_code_references([asset])
                if spec_path is not None:
                    (asset,) = map_asset_specs(add_spec, [asset])
            out.append(asset)
    return out


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
    ``extra_assets`` (a user's own, e.g. downstream of the model), each with its code references
    (:func:`with_code_references`), with ``resources`` (default: :func:`default_resources`). The training
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
        assets=[*with_code_references(job_assets, job_path), *with_code_references(extra_assets)],
        asset_checks=checks,
        jobs=jobs,
        resources=dict(resources) if resources is not None else default_resources(),
        sensors=list(sensors),
        schedules=list(schedules),
        executor=executor,
    )

"""The training asset: one partition = the job trained on one hour / day of data (``training.partition``).

It depends on the source assets through time-window partition mappings: the stream sources on
the same window, the batch sources on the window shifted back by ``training.batch_lag`` (MTRM:
today's stream with yesterday's complete batch data). A materialisation runs
:func:`~primus_dagster.training.job.run_training_job` on the executor pool resource, resumes its
MLflow run if an earlier attempt died, continues from the previous partition's model (continuous
training: the asset depends on its own previous partition, so backfills run partitions in order, and
a partition whose predecessor has no model fails unless ``automation.cold_start: allow``), and
returns AUC, samples, samples/s, the MLflow run,
the data window and the source versions as typed metadata (:func:`typed_metadata`). Each trained
partition registers its model as a version of the registered model named after the job
(``models:/<job>/<version>``, tagged with the partition, window, source versions, MLflow run and
Dagster run). The blocking ``auc_not_regressed`` check fails when the next-hour AUC drops more than
``training.auc_tolerance`` below the previous partition's; only when it passes does the alias
``champion`` move to the new version (:func:`promotes`), so ``models:/<job>@champion`` is always a
checked model. A failed check fails the step (after the materialisation and the version are
recorded), which keeps downstream assets of the run from running on it.
In a run that also materialises the sources, a failed blocking source check (see
:mod:`~primus_dagster.dagster_defs.source_checks`) keeps it from running.

Example::

    defs = Definitions(assets=[*build_source_assets(job), build_training_asset(job, "job.yaml")],
                       resources=default_resources())
"""

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    AssetsDefinition,
    DagsterInstance,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    TimeWindowPartitionMapping,
    asset,
)

from primus_dagster.dagster_defs.lineage import dagster_run_tags
from primus_dagster.dagster_defs.partitions import partitions_covering, time_partitions
from primus_dagster.dagster_defs.resources import ExecutorPoolResource, MlflowResource, PrimusStorageResource
from primus_dagster.dagster_defs.run_log import engine_logs_to
from primus_dagster.data import TimeWindow
from primus_dagster.spec import JobSpec, granularity_step
from primus_dagster.spec.durations import format_duration

if TYPE_CHECKING:  # mlflow and torch load when an asset runs, not with the definitions
    from primus_dagster.training.tracking import MlflowTracker

AUC_CHECK_NAME = "auc_not_regressed"
CHAMPION_ALIAS = "champion"  # the newest trained partition whose blocking quality check passed
ROW_COUNT = "dagster/row_count"
_TEXT = {"mlflow_run_id", "model_uri", "window_start", "window_end", "eval_window", "eval_labels"}
_TEXT |= {"warm_started_from", "cold_start", "live_run_key", "live_start", "base", "registered_model"}


def training_asset_name(job: JobSpec) -> str:
    return job.name.replace("-", "_") + "_model"


def registered_model_name(job: JobSpec) -> str:
    """The registered model (MLflow model registry) the job's trained models are versions of: the job's name."""
    return job.name


def promotes(check: AssetCheckResult) -> bool:
    """Whether a partition's model becomes the ``champion``: only when its blocking quality check passed
    (a regression, or no evaluation at all, leaves the alias on the previous checked version)."""
    return bool(check.passed)


def url_or_text(location: str) -> MetadataValue:
    """A clickable ``MetadataValue.url`` for an http(s) location (an MLflow server), else text (a
    ``sqlite:///…#/experiments/…`` locator: open it with ``mlflow ui --backend-store-uri``)."""
    if location.startswith(("http://", "https://")):
        return MetadataValue.url(location)
    return MetadataValue.text(location)


def typed_metadata(values: Mapping[str, Any]) -> dict[str, MetadataValue]:
    """Dagster's typed metadata values for a training (or live) result's metadata: text for ids, URIs
    and times, ``url_or_text`` for the MLflow run, JSON for dicts and lists (source versions, pools),
    int / float / bool by type, and ``dagster/row_count`` (samples trained). None values are left out."""
    out: dict[str, MetadataValue] = {}
    for name, value in values.items():
        if value is None:
            continue
        if name == "mlflow_run_url":
            out[name] = url_or_text(str(value))
        elif name in _TEXT or isinstance(value, str):
            out[name] = MetadataValue.text(str(value))
        elif isinstance(value, (dict, list)):
            out[name] = MetadataValue.json(value)
        elif isinstance(value, bool):
            out[name] = MetadataValue.bool(value)
        elif isinstance(value, int):
            out[name] = MetadataValue.int(value)
        elif isinstance(value, float):
            out[name] = MetadataValue.float(value)
        else:
            out[name] = MetadataValue.text(str(value))
    if "samples" in values:
        out[ROW_COUNT] = MetadataValue.int(int(values["samples"] or 0))
    return out


def register_version(
    tracker: "MlflowTracker", job: JobSpec, model_uri: str, tags: Mapping[str, Any]
) -> tuple[str, dict[str, MetadataValue]]:
    """Register ``model_uri`` as a new version of the job's registered model with ``tags``; the version
    and its metadata (``registered_model``, ``model_version``, ``model_version_uri`` and, for an MLflow
    server, ``model_version_url``)."""
    name = registered_model_name(job)
    version = tracker.register_model(model_uri, name, tags)
    metadata: dict[str, MetadataValue] = {
        "registered_model": MetadataValue.text(name),
        "model_version": MetadataValue.int(int(version)),
        "model_version_uri": MetadataValue.text(f"models:/{name}/{version}"),
    }
    url = tracker.model_version_url(name, version)
    if url.startswith(("http://", "https://")):
        metadata["model_version_url"] = MetadataValue.url(url)
    return version, metadata


def version_tags(values: Mapping[str, Any], dagster_tags: Mapping[str, str], **extra: Any) -> dict[str, str]:
    """The tags of a registered version: the Dagster run, asset and partition (``dagster.*``), the MLflow
    run, the window, the source versions (JSON: the data progress the model has seen), and ``extra``."""
    tags = {
        **dagster_tags,
        "primus.mlflow_run_id": values.get("mlflow_run_id"),
        "primus.window": f"{values.get('window_start')}/{values.get('window_end')}",
        "primus.source_versions": json.dumps(values.get("source_versions") or {}, sort_keys=True, default=str),
        "primus.samples": values.get("samples"),
        "primus.eval_auc": values.get("eval_auc"),
        **extra,
    }
    return {name: str(value) for name, value in tags.items() if value is not None}


def training_partitions_def(job: JobSpec) -> PartitionsDefinition:
    """Hourly or daily partitions, from the first window whose lagged batch data exists."""
    granularity = job.training.partition
    lag_partitions = partitions_covering(granularity, job.training.batch_lag)
    return time_partitions(granularity, job.dataset.start + granularity_step(granularity) * lag_partitions)


def source_deps(job: JobSpec, key_prefix: list[str] | None = None) -> list[AssetDep]:
    """Stream sources: the same window; batch sources: the window shifted back by the batch lag
    (offsets count training partitions, as ``TimeWindowPartitionMapping`` does)."""
    granularity, lag = job.training.partition, job.training.batch_lag
    deps = []
    for _, source in job.dataset.all_sources():
        if source.kind == "batch" and lag:
            mapping = TimeWindowPartitionMapping(
                start_offset=-partitions_covering(granularity, lag), end_offset=-(lag // granularity_step(granularity))
            )
        else:
            mapping = TimeWindowPartitionMapping()
        deps.append(AssetDep(AssetKey([*(key_prefix or []), source.name]), partition_mapping=mapping))
    return deps


def previous_partition_dep(key: AssetKey) -> AssetDep:
    """The training asset's dependency on its own previous partition: partition N continues N-1's model,
    so a backfill (and declarative automation) materialises partitions in order."""
    return AssetDep(key, partition_mapping=TimeWindowPartitionMapping(start_offset=-1, end_offset=-1))


def previous_partition(
    partitions: PartitionsDefinition, partition_key: str, instance: DagsterInstance | None = None
) -> str | None:
    keys = partitions.get_partition_keys(dynamic_partitions_store=instance)
    index = keys.index(partition_key) if partition_key in keys else -1
    return keys[index - 1] if index > 0 else None


def previous_auc(
    instance: DagsterInstance, key: AssetKey, partitions: PartitionsDefinition, partition_key: str
) -> float | None:
    """``eval_auc`` of the latest materialisation of the partition before ``partition_key``."""
    previous = previous_partition(partitions, partition_key, instance)
    if previous is None:
        return None
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=[previous]), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    value = records[0].asset_materialization.metadata.get("eval_auc")
    return None if value is None else float(value.value)


def auc_check(job: JobSpec, auc: float | None, previous: float | None) -> AssetCheckResult:
    """Pass unless the AUC dropped more than ``training.auc_tolerance`` below the previous partition's."""
    tolerance = job.training.auc_tolerance
    check_metadata = {
        "auc": auc if auc is not None else float("nan"),
        "tolerance": tolerance,
        "previous_auc": previous if previous is not None else float("nan"),
    }
    if auc is None or math.isnan(auc):
        return AssetCheckResult(
            check_name=AUC_CHECK_NAME,
            passed=False,
            severity=AssetCheckSeverity.WARN,
            metadata={**check_metadata, "reason": "no evaluation (no held-out data after the window)"},
        )
    if previous is None:
        return AssetCheckResult(
            check_name=AUC_CHECK_NAME, passed=True, metadata={**check_metadata, "reason": "first partition"}
        )
    return AssetCheckResult(
        check_name=AUC_CHECK_NAME,
        passed=auc >= previous - tolerance,
        metadata={**check_metadata, "drop": previous - auc},
    )


def build_training_asset(job: JobSpec, job_path: str | Path, key_prefix: list[str] | None = None) -> AssetsDefinition:
    """The training asset of ``job`` (see module docstring); ``job_path`` is the spec file the
    executor processes load."""
    job_path = str(Path(job_path).resolve())
    name = training_asset_name(job)
    key = AssetKey([*(key_prefix or []), name])
    partitions = training_partitions_def(job)
    model = job.training.model

    @asset(
        name=name,
        key_prefix=key_prefix,
        partitions_def=partitions,
        deps=[*source_deps(job, key_prefix), previous_partition_dep(key)],
        group_name="training",
        kinds={"pytorch", "mlflow"},
        check_specs=[
            AssetCheckSpec(
                AUC_CHECK_NAME,
                asset=key,
                description=(
                    "next-hour AUC not below the previous partition's minus the tolerance; blocking: "
                    f"the `{CHAMPION_ALIAS}` alias moves to the partition's model version only when it passes"
                ),
                blocking=True,
            )
        ],
        description=(
            f"{model.type} model of job `{job.name}` trained in `{job.training.mode}` mode per "
            f"{job.training.partition} (batch lag {format_duration(job.training.batch_lag)}); checkpoints in "
            f"MLflow, each partition's model a version of the registered model `{registered_model_name(job)}` "
            f"(`models:/{registered_model_name(job)}@{CHAMPION_ALIAS}`: the newest one whose check passed)."
        ),
    )
    def _training_asset(
        context: AssetExecutionContext,
        storage: PrimusStorageResource,
        mlflow: MlflowResource,
        executor_pool: ExecutorPoolResource,
    ) -> MaterializeResult:
        from primus_dagster.training.job import JobHooks, TrainingJob, progress_line, run_training_job

        source_context = storage.source_context(source for _, source in job.dataset.all_sources())
        partition_window = context.partition_time_window
        window = TimeWindow(partition_window.start, partition_window.end)

        def log_progress(progress: dict) -> None:
            context.log.info(progress_line(progress))

        # Continuous training: the model of the previous partition goes on learning (automation.cold_start
        # decides when it is missing); the first partition has none and starts fresh.
        previous_key = previous_partition(partitions, context.partition_key, context.instance)
        if previous_key is None:
            context.log.info(f"{context.partition_key} is the first training partition: the model starts fresh")
        tracker = mlflow.tracker(job)
        run_tags = dagster_run_tags(context)
        with engine_logs_to(context.log):  # planning, executors, phases, checkpoints, heartbeats
            result = run_training_job(
                TrainingJob(
                    job,
                    job_path,
                    storage.data_root,
                    window,
                    kafka_bootstrap=source_context.kafka_bootstrap_servers,
                    executors=executor_pool.executors(job),
                    run_key=f"{job.name}/{context.partition_key}",
                    tracker=tracker,
                    tags=run_tags,
                    progress=log_progress,
                    warm_start=f"{job.name}/{previous_key}" if previous_key else None,
                ),
                JobHooks(data_plane=executor_pool.data_plane_factory(job)),
            )
        result_metadata = result.metadata()
        previous_partition_auc = previous_auc(context.instance, key, partitions, context.partition_key)
        metadata = typed_metadata(result_metadata)
        if previous_key is None:
            metadata["cold_start"] = MetadataValue.text("first training partition")
        auc_result = auc_check(job, result_metadata.get("eval_auc"), previous_partition_auc)
        if result.model_uri:
            version, version_metadata = register_version(
                tracker,
                job,
                result.model_uri,
                version_tags(
                    result_metadata,
                    run_tags,
                    **{"primus.run_kind": "window", "primus.partition": context.partition_key},
                    **{"primus.check": "passed" if auc_result.passed else "failed"},
                ),
            )
            metadata.update(version_metadata)
            promoted = promotes(auc_result)
            if promoted:
                tracker.set_alias(registered_model_name(job), CHAMPION_ALIAS, version)
                context.log.info(f"model version {version} is the {CHAMPION_ALIAS} now")
            else:
                context.log.warning(
                    f"{AUC_CHECK_NAME} failed: model version {version} registered, "
                    f"the {CHAMPION_ALIAS} alias stays on version "
                    f"{tracker.alias_version(registered_model_name(job), CHAMPION_ALIAS)}"
                )
            metadata[CHAMPION_ALIAS] = MetadataValue.bool(promoted)
        return MaterializeResult(metadata=metadata, check_results=[auc_result])

    return _training_asset

"""The training asset: one partition = the job trained on one hour / day of data (``training.partition``).

It depends on the source assets through time-window partition mappings: the stream sources on
the same window, the batch sources on the window shifted back by ``training.batch_lag`` (MTRM:
today's stream with yesterday's complete batch data). A materialisation runs
:func:`~primus_dagster.training.job.run_training_job` on the executor pool resource, resumes its
MLflow run if an earlier attempt died, continues from the previous partition's model (continuous
training: the asset depends on its own previous partition, so backfills run partitions in order, and
a partition whose predecessor has no model fails unless ``automation.cold_start: allow``), and
returns AUC, samples, samples/s, the MLflow run,
the data window and the source versions as metadata. The ``auc_not_regressed`` check fails when
the next-hour AUC drops more than ``training.auc_tolerance`` below the previous partition's.
In a run that also materialises the sources, a failed blocking source check (see
:mod:`~primus_dagster.dagster_defs.source_checks`) keeps it from running.

Example::

    defs = Definitions(assets=[*build_source_assets(job), build_training_asset(job, "job.yaml")],
                       resources=default_resources())
"""

import math
from pathlib import Path

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
from primus_dagster.data import TimeWindow
from primus_dagster.spec import JobSpec, granularity_step

AUC_CHECK_NAME = "auc_not_regressed"


def training_asset_name(job: JobSpec) -> str:
    return job.name.replace("-", "_") + "_model"


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
                description="next-hour AUC not below the previous partition's minus the tolerance",
            )
        ],
        description=(
            f"{model.type} model of job `{job.name}` trained in `{job.training.mode}` mode per "
            f"{job.training.partition} (batch lag {job.training.batch_lag}); checkpoints and the model "
            "in MLflow."
        ),
    )
    def _training_asset(
        context: AssetExecutionContext,
        storage: PrimusStorageResource,
        mlflow: MlflowResource,
        executor_pool: ExecutorPoolResource,
    ) -> MaterializeResult:
        from primus_dagster.training.job import JobHooks, TrainingJob, run_training_job

        source_context = storage.source_context(source for _, source in job.dataset.all_sources())
        partition_window = context.partition_time_window
        window = TimeWindow(partition_window.start, partition_window.end)

        def log_progress(progress: dict) -> None:
            context.log.info(
                f"[{progress['phase']}] step {progress['step']} samples {progress['samples']} "
                f"loss {progress['loss']:.4f} train-AUC {progress['train_auc']:.4f} "
                f"{progress['samples_per_s']:.0f} samples/s"
            )

        # Continuous training: the model of the previous partition goes on learning (automation.cold_start
        # decides when it is missing); the first partition has none and starts fresh.
        previous_key = previous_partition(partitions, context.partition_key, context.instance)
        if previous_key is None:
            context.log.info(f"{context.partition_key} is the first training partition: the model starts fresh")
        result = run_training_job(
            TrainingJob(
                job,
                job_path,
                storage.data_root,
                window,
                kafka_bootstrap=source_context.kafka_bootstrap_servers,
                executors=executor_pool.executors(job),
                run_key=f"{job.name}/{context.partition_key}",
                tracker=mlflow.tracker(job),
                tags=dagster_run_tags(context),
                progress=log_progress,
                warm_start=f"{job.name}/{previous_key}" if previous_key else None,
            ),
            JobHooks(data_plane=executor_pool.data_plane_factory(job)),
        )
        result_metadata = result.metadata()
        previous_partition_auc = previous_auc(context.instance, key, partitions, context.partition_key)
        metadata = {
            name: (MetadataValue.json(value) if isinstance(value, (dict, list)) else value)
            for name, value in result_metadata.items()
            if value is not None
        }
        if previous_key is None:
            metadata["cold_start"] = "first training partition"
        metadata["mlflow_run_url"] = (
            MetadataValue.url(result.run_url)
            if result.run_url.startswith("http")
            else MetadataValue.text(result.run_url)
        )
        auc_result = auc_check(job, result_metadata.get("eval_auc"), previous_partition_auc)
        return MaterializeResult(metadata=metadata, check_results=[auc_result])

    return _training_asset

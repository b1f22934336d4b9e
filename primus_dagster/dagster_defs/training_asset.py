"""The training asset: one partition = the job trained on one hour / day of data (``training.partition``).

It depends on the source assets through time-window partition mappings: the stream sources on
the same window, the batch sources on the window shifted back by ``training.batch_lag`` (MTRM:
today's stream with yesterday's complete batch data). A materialisation runs
:func:`~primus_dagster.training.job.run_training_job` on the executor pool resource, resumes its
MLflow run if an earlier attempt died, continues from the previous partition's model when that
one finished (continuous training), and returns AUC, samples, samples/s, the MLflow run,
the data window and the source versions as metadata. The ``auc_not_regressed`` check fails when
the next-hour AUC drops more than ``training.auc_tolerance`` below the previous partition's.

Example::

    defs = Definitions(assets=[*build_source_assets(job), build_training_asset(job, "job.yaml")],
                       resources=default_resources())
"""

import math
from datetime import timedelta
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
    DailyPartitionsDefinition,
    HourlyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    TimeWindowPartitionMapping,
    asset,
)

from primus_dagster.dagster_defs.resources import (
    ExecutorPoolResource,
    KafkaResource,
    MlflowResource,
    PrimusStorageResource,
)
from primus_dagster.data.sources import TimeWindow
from primus_dagster.spec import JobSpec

CHECK_NAME = "auc_not_regressed"


def training_asset_name(job: JobSpec) -> str:
    return job.name.replace("-", "_") + "_model"


def _step(job: JobSpec) -> timedelta:
    return timedelta(hours=1) if job.training.partition == "hour" else timedelta(days=1)


def training_partitions_def(job: JobSpec) -> PartitionsDefinition:
    """Hourly or daily partitions, from the first window whose lagged batch data exists."""
    step, lag = _step(job), job.training.batch_lag
    start = job.dataset.start + step * math.ceil(lag / step) if lag else job.dataset.start
    if job.training.partition == "hour":
        return HourlyPartitionsDefinition(start_date=start.strftime("%Y-%m-%d-%H:%M"), timezone="UTC")
    return DailyPartitionsDefinition(start_date=start.strftime("%Y-%m-%d"), timezone="UTC")


def source_deps(job: JobSpec, key_prefix: list[str] | None = None) -> list[AssetDep]:
    """Stream sources: the same window; batch sources: the window shifted back by the batch lag
    (offsets count training partitions, as ``TimeWindowPartitionMapping`` does)."""
    step, lag = _step(job), job.training.batch_lag
    deps = []
    for _, source in job.dataset.all_sources():
        if source.kind == "batch" and lag:
            mapping = TimeWindowPartitionMapping(start_offset=-math.ceil(lag / step), end_offset=-(lag // step))
        else:
            mapping = TimeWindowPartitionMapping()
        deps.append(AssetDep(AssetKey([*(key_prefix or []), source.name]), partition_mapping=mapping))
    return deps


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
    meta = {
        "auc": auc if auc is not None else float("nan"),
        "tolerance": tolerance,
        "previous_auc": previous if previous is not None else float("nan"),
    }
    if auc is None or math.isnan(auc):
        return AssetCheckResult(
            check_name=CHECK_NAME,
            passed=False,
            severity=AssetCheckSeverity.WARN,
            metadata={**meta, "reason": "no evaluation (no held-out data after the window)"},
        )
    if previous is None:
        return AssetCheckResult(check_name=CHECK_NAME, passed=True, metadata={**meta, "reason": "first partition"})
    return AssetCheckResult(
        check_name=CHECK_NAME, passed=auc >= previous - tolerance, metadata={**meta, "drop": previous - auc}
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
        deps=source_deps(job, key_prefix),
        group_name="training",
        kinds={"pytorch", "mlflow"},
        check_specs=[
            AssetCheckSpec(
                CHECK_NAME,
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
        kafka: KafkaResource,
        mlflow: MlflowResource,
        executor_pool: ExecutorPoolResource,
    ) -> MaterializeResult:
        from primus_dagster.training.job import TrainingJob, run_training_job

        needs_kafka = any(s.type == "kafka" for _, s in job.dataset.all_sources())
        source_context = storage.source_context(kafka, needs_kafka=needs_kafka)
        tw = context.partition_time_window
        window = TimeWindow(tw.start, tw.end)

        def progress(p: dict) -> None:
            context.log.info(
                f"[{p['phase']}] step {p['step']} samples {p['samples']} loss {p['loss']:.4f} "
                f"train-AUC {p['train_auc']:.4f} {p['samples_per_s']:.0f} samples/s"
            )

        # Continuous training: the model of the previous partition (if it finished) goes on learning.
        previous = previous_partition(partitions, context.partition_key, context.instance)
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
                progress=progress,
                warm_start=f"{job.name}/{previous}" if previous else None,
            )
        )
        meta = result.metadata()
        auc = meta.get("eval_auc")
        previous = previous_auc(context.instance, key, partitions, context.partition_key)
        metadata = {
            k: (MetadataValue.json(v) if isinstance(v, (dict, list)) else v) for k, v in meta.items() if v is not None
        }
        metadata["mlflow_run_url"] = (
            MetadataValue.url(result.run_url)
            if result.run_url.startswith("http")
            else MetadataValue.text(result.run_url)
        )
        return MaterializeResult(metadata=metadata, check_results=[auc_check(job, auc, previous)])

    return _training_asset

"""The training asset: one partition = the job trained on one hour / day of data (``training.partition``).

It depends on the source assets through time-window partition mappings: the stream sources on
the same window, the batch sources on the window shifted back by ``training.batch_lag`` (MTRM:
today's stream with yesterday's complete batch data). A materialisation runs
:func:`~primus_dagster.training.window.train_window` on the executor pool resource, resumes its
MLflow run if an earlier attempt died, continues from the previous partition's model (continuous
training: the asset depends on its own previous partition, so backfills run partitions in order, and
a partition whose predecessor has no model fails unless ``automation.cold_start: allow``), and
returns AUC, samples, samples/s, the MLflow run,
the data window and the source versions as typed metadata (:func:`typed_metadata`); its definition
metadata holds each column's lineage from the source assets (:func:`training_column_lineage`). Each trained
partition registers its model as a version of the registered model named after the job
(``models:/<job>/<version>``, tagged with the partition, window, source versions, MLflow run and
Dagster run) -- unless it could not be evaluated (no held-out rows after the window yet): an unchecked
model is never a version; its MLflow run keeps it, and ``auc_final`` scores it from there. A partition
stands for its whole window: partitions of its sources not ready inside it fail the step before
training, naming them (``TrainingRequest.complete_window``). The blocking ``auc_not_regressed`` check (:func:`auc_check`) fails when the next-hour AUC
drops more than ``training.auc_tolerance`` below the previous partition's, and when the model does not
learn: an AUC at or below 0.5 + 0.01 (no better than chance), or below a popularity prior counted on the
same training rows and scored on the same held-out rows (:mod:`~primus_dagster.training.baseline`; the
check's metadata names the prior's feature and AUC). Only when it passes does the alias ``champion`` move
to the new version (:func:`promotes`), so ``models:/<job>@champion`` is always a checked model that
beats chance and the prior. A failed check fails the step (after the materialisation and the version are
recorded), which keeps downstream assets of the run from running on it.
In a run that also materialises the sources, a failed blocking source check (see
:mod:`~primus_dagster.dagster_defs.source_checks`) keeps it from running.

The next-hour AUC at materialisation scores hours whose labels may not be complete yet. The
non-blocking ``auc_final`` check (:func:`build_auc_final_check`) scores the same hours again once their
complete labels exist (:func:`~primus_dagster.training.evaluation.labels_complete_at`: window end +
``eval_hours`` + the label delay), with the partition's registered model version loaded from MLflow and
data read through the engine; the ``auc_final`` schedule (:mod:`~primus_dagster.dagster_defs.schedules`)
runs it as a check-only run per partition. Run earlier (by hand), it does not evaluate: it reports
"labels not complete until T" (a WARN failure).

Example::

    defs = Definitions(assets=[*build_source_assets(job), build_training_asset(job, "job.yaml")],
                       resources=default_resources())
"""

import json
import math
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    AssetsDefinition,
    DagsterInstance,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    TableColumnDep,
    TableColumnLineage,
    TimeWindowPartitionMapping,
    asset,
    asset_check,
)

from primus_dagster.dagster_defs.lineage import (
    COLUMN_SCHEMA,
    dagster_run_tags,
    tag_run_with_mlflow,
    training_column_schema,
)
from primus_dagster.dagster_defs.partitions import partitioned_check_spec, partitioned_checks, time_partitions
from primus_dagster.dagster_defs.resources import ExecutorPoolResource, MlflowResource, PrimusStorageResource
from primus_dagster.dagster_defs.run_log import engine_logs_to
from primus_dagster.dagster_defs.source_assets import COLUMN_LINEAGE, source_column_lineage
from primus_dagster.data import TimeWindow
from primus_dagster.spec import JobSpec, dependency_offsets, first_training_start
from primus_dagster.spec.durations import format_duration
from primus_dagster.training.baseline import CHANCE_MARGIN, BaselineVerdict, verdict
from primus_dagster.training.final_eval import eval_end, final_labels, labels_complete_at

if TYPE_CHECKING:  # mlflow and torch load when an asset runs, not with the definitions
    from primus_dagster.training.tracking import MlflowTracker

AUC_CHECK_NAME = "auc_not_regressed"
AUC_FINAL_CHECK_NAME = "auc_final"  # the same hours scored again once their labels are complete
CHAMPION_ALIAS = "champion"  # the newest trained partition whose blocking quality check passed
ROW_COUNT = "dagster/row_count"
_TEXT = {"mlflow_run_id", "model_uri", "window_start", "window_end", "eval_window", "eval_labels"}
_TEXT |= {"warm_started_from", "cold_start", "live_run_key", "live_start", "base", "registered_model"}


def training_asset_name(job: JobSpec) -> str:
    return job.name.replace("-", "_") + "_model"


def training_pool(job: JobSpec) -> str:
    """The Dagster concurrency pool of the job's training asset (one run at a time: primus_dagster/run_queue.py)."""
    return f"primus-training-{job.name}"


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


def failed_tasks_markdown(rows: list[dict[str, Any]], limit: int = 50) -> str:
    """The tasks a run gave up as a markdown table (file or offset range, source, partition, attempts,
    error; the first ``limit``, then a line counting the rest): the training asset's ``failed_tasks_table``.

    >>> print(failed_tasks_markdown([{"where": "a.parquet", "source": "imp", "partition": "2026-11-01T00:00",
    ...                               "attempts": 3, "error": "magic bytes | not found"}]))
    | file / offsets | source | partition | attempts | error |
    |---|---|---|---|---|
    | a.parquet | imp | 2026-11-01T00:00 | 3 | magic bytes \\| not found |
    """

    def cell(value: Any) -> str:
        return " ".join(str(value).split()).replace("|", "\\|")

    lines = ["| file / offsets | source | partition | attempts | error |", "|---|---|---|---|---|"]
    for row in rows[:limit]:
        fields = (row.get("where"), row.get("source"), row.get("partition"), row.get("attempts"), row.get("error"))
        lines.append("| " + " | ".join(cell(v) for v in fields) + " |")
    if len(rows) > limit:
        lines.append(f"\n... and {len(rows) - limit} more (every one in the `failed_tasks` entry)")
    return "\n".join(lines)


def register_version(
    tracker: "MlflowTracker", job: JobSpec, model_uri: str, tags: Mapping[str, Any]
) -> tuple[str, dict[str, MetadataValue]]:
    """Register ``model_uri`` as a new version of the job's registered model with ``tags``; the version
    and its metadata (``registered_model``, ``model_version``, ``model_version_uri`` and, for an MLflow
    server, the links ``model_version_url`` and ``registered_model_url``)."""
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
        metadata["registered_model_url"] = MetadataValue.url(url.rsplit("/versions/", 1)[0])  # every version
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
    """Hourly or daily partitions, from the first window whose lagged batch data exists
    (:func:`~primus_dagster.spec.first_training_start`)."""
    return time_partitions(job.training.partition, first_training_start(job))


def source_deps(job: JobSpec, key_prefix: list[str] | None = None) -> list[AssetDep]:
    """Stream sources: the same window; batch sources: the window shifted back by the batch lag, in whole
    training partitions (:func:`~primus_dagster.spec.dependency_offsets`: offsets count training
    partitions, as ``TimeWindowPartitionMapping`` does). A mapping holds at least the partitions the
    window reads (:func:`~primus_dagster.spec.training_inputs`): it cannot leave out the batch partitions
    whose labels are not complete yet, and names every source whatever the mode."""
    deps = []
    for _, source in job.dataset.all_sources():
        start_offset, end_offset = dependency_offsets(job, source)
        mapping = TimeWindowPartitionMapping(start_offset=start_offset, end_offset=end_offset)
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
    metadata = latest_materialization_metadata(instance, key, previous) if previous is not None else None
    value = metadata.get("eval_auc") if metadata is not None else None
    return None if value is None else float(value.value)


def baseline_metadata(baseline: BaselineVerdict | None) -> dict[str, MetadataValue]:
    """The popularity prior of an evaluation as check metadata: ``popularity_auc``, ``popularity_feature``
    and every feature's AUC (``popularity_aucs``); empty without a prior."""
    if baseline is None:
        return {}
    return {
        "popularity_auc": MetadataValue.float(float(baseline.popularity_auc)),
        "popularity_feature": MetadataValue.text(baseline.popularity_feature),
        "popularity_aucs": MetadataValue.json({k: None if math.isnan(v) else v for k, v in baseline.aucs.items()}),
    }


def auc_check(
    job: JobSpec, auc: float | None, previous: float | None, baseline: BaselineVerdict | None = None
) -> AssetCheckResult:
    """Pass unless the AUC dropped more than ``training.auc_tolerance`` below the previous partition's,
    or the model does not learn (:func:`~primus_dagster.training.baseline.verdict`): an AUC at or below
    0.5 + ``CHANCE_MARGIN``, or below ``baseline``, the popularity prior on the same rows (None: a model
    without sparse features, only the chance guard applies). Those fail with severity ERROR
    (``training.baseline_guard: block``, the default) or WARN (``warn``) -- never promoted either way --,
    the metadata naming the prior and the reason; no AUC at all is a WARN."""
    tolerance = job.training.auc_tolerance
    check_metadata: dict[str, Any] = {
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
    learns, why = verdict(auc, baseline)
    check_metadata |= {**baseline_metadata(baseline), "chance_margin": CHANCE_MARGIN, "baseline_verdict": why}
    if not learns:
        return AssetCheckResult(
            check_name=AUC_CHECK_NAME,
            passed=False,
            severity=AssetCheckSeverity.ERROR if job.training.baseline_guard == "block" else AssetCheckSeverity.WARN,
            description=why,
            metadata={**check_metadata, "reason": why},
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


def training_column_lineage(job: JobSpec, key_prefix: list[str] | None = None) -> TableColumnLineage:
    """Each canonical sample column the training asset consumes, from the same column of every source asset
    that produces it (``dagster/column_lineage`` of its definition; each source's own lineage goes on to its
    native columns, :func:`~primus_dagster.dagster_defs.source_assets.source_column_lineage`)."""
    deps: dict[str, list[TableColumnDep]] = {}
    for _, source in job.dataset.all_sources():
        source_key = AssetKey([*(key_prefix or []), source.name])
        for name in source_column_lineage(source, source_key).deps_by_column:
            deps.setdefault(name, []).append(TableColumnDep(asset_key=source_key, column_name=name))
    return TableColumnLineage(deps_by_column=deps)


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
        owners=job.owners or None,  # the spec's owners and tags (JobSpec.owners / tags)
        tags=job.tags or None,
        # Dagster's concurrency pool of the job's training: with a limit of 1 (the local instance's default,
        # primus_dagster/run_queue.py; README: "One run per window") two materialisations never train at
        # once, whatever launched them (a sensor's job, the UI's Materialize dialog, a backfill); without a
        # limit the run lock refuses the second.
        pool=training_pool(job),
        metadata={COLUMN_LINEAGE: MetadataValue.column_lineage(training_column_lineage(job, key_prefix))},
        check_specs=[
            partitioned_check_spec(  # each evaluation recorded against its training partition
                AUC_CHECK_NAME,
                partitions,
                asset=key,
                description=(
                    "next-hour AUC not below the previous partition's minus the tolerance, above chance "
                    f"(0.5 + {CHANCE_MARGIN}) and not below the popularity prior on the same rows; blocking: "
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
        from primus_dagster.training.progress import progress_line
        from primus_dagster.training.run_state import RunHooks, TrainingRequest
        from primus_dagster.training.window import train_window

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
            result = train_window(
                TrainingRequest(
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
                    complete_window=True,  # a materialised partition stands for its whole window
                ),
                RunHooks(data_plane=executor_pool.data_plane_factory(job)),
            )
        tag_run_with_mlflow(context, result.run_id)
        result_metadata = result.metadata()
        previous_partition_auc = previous_auc(context.instance, key, partitions, context.partition_key)
        metadata = typed_metadata(result_metadata)
        metadata[COLUMN_SCHEMA] = MetadataValue.table_schema(training_column_schema(job))
        if result.failed_tasks:  # given up below data.failed_task_threshold: a table in the asset's page
            metadata["failed_tasks_table"] = MetadataValue.md(failed_tasks_markdown(result.failed_tasks))
        if previous_key is None:
            metadata["cold_start"] = MetadataValue.text("first training partition")
        baseline = result.evaluation.baseline if result.evaluation is not None else None
        eval_auc = result_metadata.get("eval_auc")
        auc_result = auc_check(job, eval_auc, previous_partition_auc, baseline)
        if result.model_uri and (eval_auc is None or math.isnan(eval_auc)):
            # nothing checked it: no version to pick by mistake (auc_final scores the run's model later)
            why = "no evaluation after the window: not registered (auc_final scores it from its MLflow run)"
            context.log.warning(f"model {result.model_uri}: {why}")
            metadata["model_registered"] = MetadataValue.text(why)
        elif result.model_uri:
            version, version_metadata = register_version(
                tracker,
                job,
                result.model_uri,
                version_tags(
                    result_metadata,
                    {**job.tags, **run_tags},  # the spec's tags, then the Dagster run's
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


def latest_materialization_metadata(
    instance: DagsterInstance, key: AssetKey, partition_key: str
) -> Mapping[str, MetadataValue] | None:
    """The metadata of the latest materialisation of ``key``'s partition ``partition_key`` (None: never)."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=[partition_key]), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    return records[0].asset_materialization.metadata


def latest_complete_partition(job: JobSpec, partitions: PartitionsDefinition, now: datetime) -> str | None:
    """The newest training partition whose final labels are complete at ``now`` (None: none yet)."""
    keys = partitions.get_partition_keys(current_time=now)
    for partition_key in reversed(keys):
        end = partitions.time_window_for_partition_key(partition_key).end  # type: ignore[attr-defined]
        if labels_complete_at(job, end) <= now:
            return partition_key
    return None


def _not_evaluated(why: str, metadata: Mapping[str, Any]) -> AssetCheckResult:
    return AssetCheckResult(
        check_name=AUC_FINAL_CHECK_NAME,
        passed=False,
        severity=AssetCheckSeverity.WARN,
        description=why,
        metadata={**metadata, "reason": MetadataValue.text(why)},
    )


def build_auc_final_check(job: JobSpec, key_prefix: list[str] | None = None) -> AssetChecksDefinition:
    """The non-blocking ``auc_final`` check of the training asset (module docstring), partitioned as the asset: a
    run scores its training partition (the run tag ``dagster/partition``, as the schedule's requests set it; a run
    without one: the newest partition whose labels are complete), and the check's history lists each evaluation
    under its partition.

    It passes when the final AUC beats chance (> 0.5) and, where the popularity prior of the partition's
    training rows could be counted, the verdict of :func:`~primus_dagster.training.baseline.verdict` (above
    0.5 + 0.01 and not below the prior on the same held-out rows: ``popularity_auc``, ``popularity_feature``,
    ``baseline_verdict``). It records ``auc_final``, ``rows``, the labels used, the AUC at materialisation
    (``eval_auc``) and the change; it also logs ``final_auc`` to the partition's MLflow run and tags the
    model version ``primus.final_auc``.

    Example::

        defs = Definitions(assets=[training], asset_checks=[build_auc_final_check(job)], ...)
    """
    key = AssetKey([*(key_prefix or []), training_asset_name(job)])
    partitions = training_partitions_def(job)

    def _auc_final(
        context: AssetCheckExecutionContext, storage: PrimusStorageResource, mlflow: MlflowResource
    ) -> AssetCheckResult:
        from primus_dagster.training.evaluation import evaluate_window

        now = datetime.now(timezone.utc)
        # Selected along with a materialisation (the UI's "Materialize", `dagster asset materialize`), it
        # scores that run's partition: usually "labels not complete until ...".
        run = context.op_execution_context
        partition_key = run.partition_key if run.has_partition_key else latest_complete_partition(job, partitions, now)
        if not partition_key:
            return _not_evaluated("no training partition has complete labels yet", {})
        if not partitions.has_partition_key(partition_key):
            return _not_evaluated(
                f"{partition_key!r} is not a training partition of job {job.name} (e.g. "
                f"{partitions.get_first_partition_key()!r})",
                {},
            )
        window = partitions.time_window_for_partition_key(partition_key)  # type: ignore[attr-defined]
        complete = labels_complete_at(job, window.end)
        metadata: dict[str, Any] = {
            "partition": MetadataValue.text(partition_key),
            "labels_complete_at": MetadataValue.timestamp(complete),
        }
        if now < complete:
            return _not_evaluated(f"labels not complete until {complete.isoformat()}", metadata)
        trained = latest_materialization_metadata(context.instance, key, partition_key) or {}
        uris = [str(trained[name].value) for name in ("model_version_uri", "model_uri") if name in trained]
        model_uri = next((uri for uri in uris if uri), None)
        if model_uri is None:
            return _not_evaluated(f"partition {partition_key} has no trained model", metadata)
        metadata["model"] = MetadataValue.text(model_uri)
        tracker = mlflow.tracker(job)
        model = load_model(tracker.tracking_uri, model_uri)
        context.log.info(f"{AUC_FINAL_CHECK_NAME}: scoring {model_uri} ({partition_key}) on complete labels")
        kind = final_labels(job)
        evaluation = evaluate_window(
            job,
            storage.source_context(source for _, source in job.dataset.all_sources()),
            model,
            window.end,
            eval_end(job, window.end),
            labels=(kind,),
            train_start=window.start,
        )
        if evaluation is None:
            return _not_evaluated(f"no {kind} rows in the hours after {partition_key}", metadata)
        auc = float(evaluation.result.auc)
        metadata |= {
            "auc_final": MetadataValue.float(auc),
            "rows": MetadataValue.int(int(evaluation.result.rows)),
            "labels": MetadataValue.text(evaluation.labels),
            "eval_window": MetadataValue.text(
                f"{evaluation.window.start.isoformat()}/{evaluation.window.end.isoformat()}"
            ),
        }
        if "eval_auc" in trained:
            at_materialisation = float(trained["eval_auc"].value)
            metadata |= {
                "eval_auc": MetadataValue.float(at_materialisation),
                "auc_change": MetadataValue.float(auc - at_materialisation),
            }
        if "mlflow_run_id" in trained:
            tracker.client.log_metric(str(trained["mlflow_run_id"].value), "final_auc", auc)
        if "model_version" in trained:
            tracker.client.set_model_version_tag(
                registered_model_name(job), str(trained["model_version"].value), "primus.final_auc", f"{auc:.6f}"
            )
        passed = auc > 0.5
        if evaluation.baseline is not None:  # the guard of the training check, on complete labels
            passed, why = evaluation.verdict()
            metadata |= {**baseline_metadata(evaluation.baseline), "baseline_verdict": MetadataValue.text(why)}
        return AssetCheckResult(
            check_name=AUC_FINAL_CHECK_NAME,
            passed=passed,
            severity=AssetCheckSeverity.WARN,
            metadata=metadata,
        )

    with partitioned_checks():
        return asset_check(
            asset=key,
            name=AUC_FINAL_CHECK_NAME,
            blocking=False,
            description=(
                f"AUC of the partition's model on the {job.training.eval_hours} hour(s) after its window, once their "
                "complete labels exist (window end + eval hours + label delay); recorded, never blocking"
            ),
            partitions_def=partitions,
        )(_auc_final)


def load_model(tracking_uri: str, model_uri: str) -> Any:
    """The PyTorch model at ``model_uri`` (``models:/<name>/<version>`` or ``models:/<id>``) of MLflow at
    ``tracking_uri``."""
    import mlflow.pytorch

    from primus_dagster.training.tracking import use_tracking_uri

    with use_tracking_uri(tracking_uri):
        return mlflow.pytorch.load_model(model_uri)

"""Links from what the engine records (MLflow runs) back to the Dagster run, asset and partition, and the
column schemas (``dagster/column_schema``) of the source and training assets.

Example::

    TrainingRequest(..., tags=dagster_run_tags(context))   # MLflow tags dagster.run_id, dagster.asset, ...
    tag_run_with_mlflow(context, result.run_id)            # the Dagster run's tag mlflow/run_id
    {"dagster/column_schema": source_column_schema(source, scan.schema)}   # canonical columns <- native ones
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from dagster import AssetExecutionContext, MetadataValue, TableColumn, TableColumnConstraints, TableSchema

from primus_dagster.data import declared_schema
from primus_dagster.spec import JobSpec, SourceSpec

COLUMN_SCHEMA = "dagster/column_schema"
ROW_COUNT = "dagster/row_count"


def location_value(location: str) -> MetadataValue:
    """A typed value for where data lives: ``url`` for http(s), ``path`` for a local path (absolute or
    ``file://``), text otherwise (an object-store URI, a Kafka topic)."""
    if location.startswith(("http://", "https://")):
        return MetadataValue.url(location)
    if location.startswith("/") or location.startswith("file://"):
        return MetadataValue.path(location.removeprefix("file://"))
    return MetadataValue.text(location)


def dagster_run_tags(context: AssetExecutionContext) -> dict[str, str]:
    """MLflow run tags naming the Dagster run, asset and (if any) partition that trained a model; the run's
    *Source* in MLflow is the Dagster job (type ``JOB``), not the step process's script."""
    tags = {
        "dagster.run_id": context.run.run_id,
        "dagster.job": context.job_name,
        "dagster.asset": context.asset_key.to_user_string(),
        "mlflow.source.name": f"dagster job {context.job_name}",
        "mlflow.source.type": "JOB",
    }
    if context.has_partition_key:
        tags["dagster.partition"] = context.partition_key
    return tags


MLFLOW_RUN_TAG = "mlflow/run_id"  # on the Dagster run: the MLflow run it trained (filter runs by it in the UI)


def tag_run_with_mlflow(context: AssetExecutionContext, mlflow_run_id: str | None) -> None:
    """Tag the Dagster run with the MLflow run it trained (``mlflow/run_id``), the way back from Dagster to
    MLflow beside the asset's ``mlflow_run_url`` metadata (the MLflow run carries ``dagster.run_id``)."""
    if mlflow_run_id:
        context.instance.add_run_tags(context.run.run_id, {MLFLOW_RUN_TAG: mlflow_run_id})


def _native_names(source: SourceSpec) -> dict[str, str]:
    """Canonical column -> the native column(s) of ``source`` it is read from."""
    mapping = source.columns
    names = {"ts": mapping.ts, "dense": mapping.dense if isinstance(mapping.dense, str) else ", ".join(mapping.dense)}
    if mapping.label:
        names["label"] = mapping.label
    if mapping.id:
        names["sample_id"] = mapping.id
    names.update(dict(mapping.sparse_pairs()))
    names["source"], names["kind"] = "(the source's name)", "(batch | stream)"
    return names


def source_column_schema(source: SourceSpec, schema: pa.Schema | None = None) -> TableSchema:
    """The canonical columns a partition of ``source`` reads as (``schema``: what a scan found; default:
    what the spec's column mapping gives), each described by the native column(s) it comes from."""
    return _table_schema([(source, schema if schema is not None else declared_schema(source.columns))])


def training_column_schema(job: JobSpec) -> TableSchema:
    """The canonical sample columns the training asset consumes: the union over the job's sources, each
    described by the native columns it comes from per source."""
    return _table_schema((source, declared_schema(source.columns)) for _, source in job.dataset.all_sources())


def _table_schema(parts: Iterable[tuple[SourceSpec, pa.Schema]]) -> TableSchema:
    types: dict[str, str] = {}
    nullable: dict[str, bool] = {}
    origins: dict[str, list[str]] = {}
    for source, schema in parts:
        natives = _native_names(source)
        for field in schema:
            types.setdefault(field.name, str(field.type))
            nullable[field.name] = nullable.get(field.name, False) or field.nullable
            origins.setdefault(field.name, []).append(f"{source.name}: {natives.get(field.name, field.name)}")
    return TableSchema(
        columns=[
            TableColumn(
                name,
                types[name],
                description="; ".join(origins[name]),
                constraints=TableColumnConstraints(nullable=nullable[name]),
            )
            for name in types
        ]
    )

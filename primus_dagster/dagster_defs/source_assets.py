"""One Dagster asset per source of a JobSpec, partitioned hourly or daily as the spec says, with blocking checks.

Materialising a partition scans it and records rows (also as ``dagster/row_count``), the canonical
columns it reads as (``dagster/column_schema``, each column naming its native one), bytes, files/tasks,
its location (a typed path or url), version or Kafka offsets, a schema hash and a preview as metadata; the data itself stays in its storage (no IO manager).
A partition that is not ready (no ``_SUCCESS`` marker, the stream not past it, ...) fails the step:
there is nothing to record. A readable partition is materialised, and its problems fail the
blocking checks of :mod:`~primus_dagster.dagster_defs.source_checks` (``no_unreadable_files``,
``schema_matches_spec``, ``not_empty``, ``event_times_in_partition``, ``label_rate_in_range``,
``freshness``), which keep the training
asset from running on it in the same run. Each asset has a freshness policy (:func:`source_freshness_policy`):
its newest materialisation is expected within two partitions plus the source's label delay. Its definition
metadata holds the column lineage (``dagster/column_lineage``: :func:`source_column_lineage`), known from the spec.

Example::

    job = load_job_spec("examples/job.yaml")
    defs = Definitions(assets=build_source_assets(job), resources=default_resources())
"""

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    Failure,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    TableColumnDep,
    TableColumnLineage,
    asset,
)

from primus_dagster.dagster_defs.lineage import COLUMN_SCHEMA, ROW_COUNT, location_value, source_column_schema
from primus_dagster.dagster_defs.partitions import time_partitions
from primus_dagster.dagster_defs.resources import PrimusStorageResource
from primus_dagster.dagster_defs.source_checks import source_check_results, source_check_specs
from primus_dagster.data import PartitionScan, ReadTask, make_adapter, scan_with_findings, schema_hash
from primus_dagster.spec import JobSpec, SourceSpec, StreamSpec, granularity_step, redact
from primus_dagster.spec.durations import format_duration

COLUMN_LINEAGE = "dagster/column_lineage"
_WEIGHTS_SUFFIX = ".weights"  # a list column's weights column, as the canonical schema names it


def source_column_lineage(source: SourceSpec, asset_key: AssetKey) -> TableColumnLineage:
    """Each canonical column a partition of ``source`` reads as, from the native column(s) of the source the
    spec's ``columns:`` maps onto it (``dense``: every dense column; ``<list>.weights``: its weights column).
    The dependencies name the source asset itself (``asset_key``): it stands for the native table, which has no asset of its own. The
    constants ``source`` and ``kind`` come from no column and have no entry."""
    mapping = source.columns
    natives: dict[str, list[str]] = {
        "sample_id": [mapping.id] if mapping.id else [],
        "ts": [mapping.ts],
        "label": [mapping.label] if mapping.label else [],
        "dense": [mapping.dense] if isinstance(mapping.dense, str) else list(mapping.dense),
    }
    natives.update((name, [native]) for name, native in mapping.sparse_pairs())
    for name, native in mapping.list_pairs():
        natives[name] = [native]
        if name in mapping.weights:
            natives[name + _WEIGHTS_SUFFIX] = [mapping.weights[name]]
    return TableColumnLineage(
        deps_by_column={
            name: [TableColumnDep(asset_key=asset_key, column_name=column) for column in columns]
            for name, columns in natives.items()
            if columns
        }
    )


def source_freshness_policy(source: SourceSpec) -> FreshnessPolicy:
    """Dagster's freshness policy of a source asset: partitions land one per ``granularity`` once their labels
    are complete (end + ``label_delay``), so its newest materialisation warns when older than one and a half
    partitions plus the label delay, and fails when older than two plus the label delay (a partition missed)."""
    step = granularity_step(source.granularity)
    return FreshnessPolicy.time_window(
        fail_window=2 * step + source.label_delay, warn_window=step + step / 2 + source.label_delay
    )


def _preview_markdown(scan: PartitionScan) -> str:
    """The scan's first rows as a markdown table; timestamps formatted in Arrow (a misread epoch unit may
    lie beyond Python's datetimes)."""
    if scan.preview is None or scan.preview.num_rows == 0:
        return "(no rows)"
    preview = scan.preview
    for index, column in enumerate(preview.schema):
        if pa.types.is_timestamp(column.type):
            text = pc.strftime(preview.column(index), format="%Y-%m-%d %H:%M:%S")
            preview = preview.set_column(index, column.name, pc.replace_substring_regex(text, r"\.\d+$", ""))
    rows = preview.to_pylist()
    columns = [c for c in preview.column_names if c not in ("source", "kind")]

    def cell(value: object) -> str:
        if isinstance(value, list):
            value = "[" + ", ".join(f"{v:.3g}" for v in value[:4]) + (", …]" if len(value) > 4 else "]")
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _materialization_metadata(source: SourceSpec, scan: PartitionScan) -> dict[str, object]:
    part = scan.partition
    metadata: dict[str, object] = {
        ROW_COUNT: MetadataValue.int(scan.rows),
        COLUMN_SCHEMA: MetadataValue.table_schema(source_column_schema(source, scan.schema)),
        "rows": MetadataValue.int(scan.rows),
        "arrow_bytes": MetadataValue.int(scan.arrow_bytes),
        "storage_bytes": MetadataValue.int(part.bytes or 0),
        "files": MetadataValue.int(part.files),
        "tasks": MetadataValue.int(scan.tasks),
        "failed_tasks": MetadataValue.int(len(scan.errors)),
        "location": location_value(part.location),
        "schema_hash": MetadataValue.text(schema_hash(scan.schema) if scan.schema is not None else ""),
        "positives": MetadataValue.int(scan.positives),
        "labelled_rows": MetadataValue.int(scan.labelled_rows),
        "preview": MetadataValue.md(_preview_markdown(scan)),
    }
    if scan.rows:
        metadata["ctr"] = MetadataValue.float(scan.positives / max(scan.labelled_rows, 1))
    if scan.min_ts is not None and scan.max_ts is not None:
        metadata["event_time_range"] = MetadataValue.text(f"{scan.min_ts.isoformat()} .. {scan.max_ts.isoformat()}")
    if part.version is not None:
        metadata["version"] = MetadataValue.text(str(part.version))
    if "offsets" in part.detail:
        metadata["kafka_offsets"] = MetadataValue.json(part.detail["offsets"])
        metadata["bad_records"] = MetadataValue.int(scan.bad_records)
        if scan.bad_examples:
            metadata["bad_record_examples"] = MetadataValue.json(scan.bad_examples)
    return metadata


def build_source_asset(
    job: JobSpec, stream: StreamSpec, source: SourceSpec, key_prefix: list[str] | None = None
) -> AssetsDefinition:
    """The partitioned asset of one source, with its blocking checks (see module docstring)."""
    asset_key = AssetKey([*(key_prefix or []), source.name])
    description = (
        f"{source.type} source `{source.name}` ({source.kind}, per {source.granularity}) of stream "
        f"`{stream.name}` in job `{job.name}`; label delay {format_duration(source.label_delay)}."
    )

    partitions = time_partitions(source.granularity, job.dataset.start, job.dataset.end)

    @asset(
        key=asset_key,
        partitions_def=partitions,
        group_name=stream.name,
        owners=job.owners or None,  # the spec's owners and tags (JobSpec.owners / tags)
        tags=job.tags or None,
        kinds={source.type},
        description=description,
        metadata={
            "source_type": source.type,
            "kind": source.kind,
            "spec": MetadataValue.json(redact(source)),  # secrets (storage_options, tokens) masked
            COLUMN_LINEAGE: MetadataValue.column_lineage(source_column_lineage(source, asset_key)),
        },
        check_specs=source_check_specs(asset_key, partitions),
        freshness_policy=source_freshness_policy(source),
    )
    def _source_asset(context: AssetExecutionContext, storage: PrimusStorageResource) -> MaterializeResult:
        with make_adapter(source, storage.source_context([source])) as adapter:
            partition = adapter.partition(context.partition_time_window.start)
            if not partition.ready:
                raise Failure(
                    description=f"{source.name} partition {context.partition_key} is not ready: {partition.reason}",
                    metadata={"location": partition.location},
                )

            def log_progress(task: ReadTask, index: int, total: int) -> None:
                if index == total or index % max(1, total // 10) == 0:
                    context.log.info(f"{source.name} {context.partition_key}: read {index}/{total} tasks")

            found = scan_with_findings(adapter, partition, on_task=log_progress)
        check_results = source_check_results(asset_key, context.partition_key, found, source.allow_empty, source.checks)
        for failed in (result for result in check_results if not result.passed):
            context.log.error(
                f"{source.name} {context.partition_key}: {failed.check_name} failed: {failed.description}"
            )
        return MaterializeResult(metadata=_materialization_metadata(source, found.scan), check_results=check_results)

    return _source_asset


def build_source_assets(job: JobSpec, key_prefix: list[str] | None = None) -> list[AssetsDefinition]:
    """One asset per source of ``job``, in spec order."""
    return [build_source_asset(job, stream, source, key_prefix) for stream, source in job.dataset.all_sources()]

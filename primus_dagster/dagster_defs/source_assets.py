"""One Dagster asset per source of a JobSpec, partitioned hourly or daily as the spec says.

Materialising a partition validates it (ready, schema, not empty, event times inside the
partition) and records rows, bytes, files/tasks, version or Kafka offsets, a schema hash
and a preview as metadata. The data itself stays in its storage (no IO manager).

Example::

    job = load_job_spec("examples/job.yaml")
    defs = Definitions(assets=build_source_assets(job), resources=default_resources())
"""

import json
from datetime import datetime

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    DailyPartitionsDefinition,
    Failure,
    HourlyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    asset,
)

from primus_dagster.dagster_defs.resources import KafkaResource, PrimusStorageResource
from primus_dagster.data.canonical import schema_hash
from primus_dagster.data.sources import make_adapter, scan_partition, scan_problems
from primus_dagster.spec import JobSpec, SourceSpec, StreamSpec


def partitions_def_for(source: SourceSpec, job: JobSpec) -> PartitionsDefinition:
    """Hourly or daily partitions from the dataset's start (and end, if any), in UTC."""
    start, end = job.dataset.start, job.dataset.end
    if source.granularity == "hour":
        fmt = "%Y-%m-%d-%H:%M"
        return HourlyPartitionsDefinition(
            start_date=start.strftime(fmt), end_date=end.strftime(fmt) if end else None, timezone="UTC"
        )
    fmt = "%Y-%m-%d"
    return DailyPartitionsDefinition(
        start_date=start.strftime(fmt), end_date=end.strftime(fmt) if end else None, timezone="UTC"
    )


def _preview_markdown(scan) -> str:
    if scan.preview is None or scan.preview.num_rows == 0:
        return "(no rows)"
    rows = scan.preview.to_pylist()
    columns = [c for c in scan.preview.column_names if c not in ("source", "kind")]

    def cell(value: object) -> str:
        if isinstance(value, list):
            value = "[" + ", ".join(f"{v:.3g}" for v in value[:4]) + (", …]" if len(value) > 4 else "]")
        elif isinstance(value, datetime):
            value = value.strftime("%Y-%m-%d %H:%M:%S")
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _metadata(scan) -> dict[str, object]:
    part = scan.partition
    meta: dict[str, object] = {
        "rows": MetadataValue.int(scan.rows),
        "arrow_bytes": MetadataValue.int(scan.arrow_bytes),
        "storage_bytes": MetadataValue.int(part.bytes or 0),
        "files": MetadataValue.int(part.files),
        "tasks": MetadataValue.int(scan.tasks),
        "location": MetadataValue.text(part.location),
        "schema_hash": MetadataValue.text(schema_hash(scan.schema) if scan.schema is not None else ""),
        "positives": MetadataValue.int(scan.positives),
        "labelled_rows": MetadataValue.int(scan.labelled_rows),
        "preview": MetadataValue.md(_preview_markdown(scan)),
    }
    if scan.rows:
        meta["ctr"] = MetadataValue.float(scan.positives / max(scan.labelled_rows, 1))
    if scan.min_ts is not None:
        meta["event_time_range"] = MetadataValue.text(f"{scan.min_ts.isoformat()} .. {scan.max_ts.isoformat()}")
    if part.version is not None:
        meta["version"] = MetadataValue.text(str(part.version))
    if "offsets" in part.detail:
        meta["kafka_offsets"] = MetadataValue.json(part.detail["offsets"])
        meta["bad_records"] = MetadataValue.int(scan.bad_records)
        if scan.bad_examples:
            meta["bad_record_examples"] = MetadataValue.json(scan.bad_examples)
    return meta


def build_source_asset(
    job: JobSpec, stream: StreamSpec, source: SourceSpec, key_prefix: list[str] | None = None
) -> AssetsDefinition:
    """The partitioned asset of one source (see module docstring)."""
    description = (
        f"{source.type} source `{source.name}` ({source.kind}, per {source.granularity}) of stream "
        f"`{stream.name}` in job `{job.name}`; label delay {source.label_delay}."
    )

    @asset(
        name=source.name,
        key_prefix=key_prefix,
        partitions_def=partitions_def_for(source, job),
        group_name=stream.name,
        kinds={source.type},
        description=description,
        metadata={
            "source_type": source.type,
            "kind": source.kind,
            "spec": MetadataValue.json(json.loads(source.model_dump_json())),
        },
    )
    def _source_asset(
        context: AssetExecutionContext, storage: PrimusStorageResource, kafka: KafkaResource
    ) -> MaterializeResult:
        source_context = storage.source_context(kafka, needs_kafka=source.type == "kafka")
        with make_adapter(source, source_context) as adapter:
            start = context.partition_time_window.start
            part = adapter.partition(start)
            if not part.ready:
                raise Failure(
                    description=f"{source.name} partition {context.partition_key} is not ready: {part.reason}",
                    metadata={"location": part.location},
                )

            def progress(task, index: int, total: int) -> None:
                if index == total or index % max(1, total // 10) == 0:
                    context.log.info(f"{source.name} {context.partition_key}: read {index}/{total} tasks")

            scan = scan_partition(adapter, part, on_task=progress)
            problems = scan_problems(scan, source.allow_empty)
            if problems:
                raise Failure(
                    description=f"{source.name} partition {context.partition_key} is invalid:\n- "
                    + "\n- ".join(problems),
                    metadata=_metadata(scan),
                )
            return MaterializeResult(metadata=_metadata(scan))

    return _source_asset


def build_source_assets(job: JobSpec, key_prefix: list[str] | None = None) -> list[AssetsDefinition]:
    """One asset per source of ``job``, in spec order."""
    return [build_source_asset(job, stream, source, key_prefix) for stream, source in job.dataset.all_sources()]

"""The blocking asset checks of a source asset, one per concern, from what scanning its partition found.

``no_unreadable_files``, ``schema_matches_spec``, ``not_empty`` and ``event_times_in_partition``
are declared on every source asset (:func:`source_check_specs`) and evaluated in the same step as
the materialisation (:func:`source_check_results`): a readable partition with problems is still
materialised with its metadata, and a failed check (severity ERROR, blocking) keeps the assets
downstream of it in the same run -- the training asset -- from running. A failed check names the
problems in its description and metadata, and the partition in its metadata (the checks are per
asset, not per partition: Dagster's partitioned checks are a preview feature).

Example::

    scan, schema_error_uris = scan_recording_schema_errors(adapter, adapter.partition(start))
    results = source_check_results(key, "2026-11-01-00:00", scan, schema_error_uris, allow_empty=False)
    [(r.check_name, r.passed) for r in results]      # [("no_unreadable_files", True), ...]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
from dagster import AssetCheckResult, AssetCheckSpec, AssetKey, MetadataValue

from primus_dagster.data import (
    Partition,
    PartitionScan,
    ReadTask,
    SchemaMismatchError,
    SourceAdapter,
    scan_partition,
    schema_hash,
)

NO_UNREADABLE_FILES = "no_unreadable_files"
SCHEMA_MATCHES_SPEC = "schema_matches_spec"
NOT_EMPTY = "not_empty"
EVENT_TIMES_IN_PARTITION = "event_times_in_partition"

SOURCE_CHECK_DESCRIPTIONS = {
    NO_UNREADABLE_FILES: "every file / offset range of the partition could be read",
    SCHEMA_MATCHES_SPEC: "every file has the columns the spec maps, with usable types",
    NOT_EMPTY: "the partition has rows (unless the source sets allow_empty)",
    EVENT_TIMES_IN_PARTITION: "every row's event time lies inside the partition's time window",
}

_LISTED_PROBLEMS = 20


def source_check_specs(asset_key: AssetKey) -> list[AssetCheckSpec]:
    """The blocking checks of the source asset ``asset_key``."""
    return [
        AssetCheckSpec(name, asset=asset_key, description=description, blocking=True)
        for name, description in SOURCE_CHECK_DESCRIPTIONS.items()
    ]


class _SchemaErrorRecorder:
    """Reads through ``adapter``, remembering the tasks whose read raised :class:`SchemaMismatchError`."""

    def __init__(self, adapter: SourceAdapter) -> None:
        self.adapter = adapter
        self.schema_error_uris: set[str] = set()

    @property
    def last_read_stats(self) -> dict:
        return self.adapter.last_read_stats

    def split(self, partition: Partition) -> list[ReadTask]:
        return self.adapter.split(partition)

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        try:
            yield from self.adapter.read(task)
        except SchemaMismatchError:
            self.schema_error_uris.add(task.uri)
            raise


def scan_recording_schema_errors(
    adapter: SourceAdapter, partition: Partition, on_task: Callable[[ReadTask, int, int], None] | None = None
) -> tuple[PartitionScan, frozenset[str]]:
    """:func:`~primus_dagster.data.scan_partition` of ``partition``, and the URIs of the tasks whose
    read failed on a schema mismatch (their errors are in ``scan.errors`` with the others)."""
    # PartitionScan.errors keeps only (uri, message): the exception type that tells a schema mismatch
    # from an unreadable file is recorded here until the scan records it itself.
    recorder = _SchemaErrorRecorder(adapter)
    scan = scan_partition(recorder, partition, on_task=on_task)  # type: ignore[arg-type]
    return scan, frozenset(recorder.schema_error_uris)


def _error_lines(errors: list[tuple[str, str]]) -> list[str]:
    return [message if message.startswith(uri) else f"{uri}: {message}" for uri, message in errors]


def _result(asset_key: AssetKey, check_name: str, problems: list[str], metadata: dict[str, object]) -> AssetCheckResult:
    if not problems:
        return AssetCheckResult(asset_key=asset_key, check_name=check_name, passed=True, metadata=metadata)
    listed = problems[:_LISTED_PROBLEMS]
    more = f"\n- … and {len(problems) - len(listed)} more" if len(problems) > len(listed) else ""
    return AssetCheckResult(
        asset_key=asset_key,
        check_name=check_name,
        passed=False,
        description="\n- ".join([f"{len(problems)} problem(s):", *listed]) + more,
        metadata={
            **metadata,
            "problem_count": MetadataValue.int(len(problems)),
            "problems": MetadataValue.json(listed),
        },
    )


def source_check_results(
    asset_key: AssetKey, partition_key: str, scan: PartitionScan, schema_error_uris: frozenset[str], allow_empty: bool
) -> list[AssetCheckResult]:
    """One result per check of :func:`source_check_specs` for the scanned partition ``partition_key``.

    A partition fails some check exactly when :func:`~primus_dagster.data.scan_problems` lists a problem.
    """
    partition = scan.partition
    partition_metadata = {"partition": MetadataValue.text(partition_key), "tasks": MetadataValue.int(scan.tasks)}
    schema_errors = [(uri, message) for uri, message in scan.errors if uri in schema_error_uris]
    read_errors = [(uri, message) for uri, message in scan.errors if uri not in schema_error_uris]

    empty_problems = []
    if scan.rows == 0 and not allow_empty:
        cause = "no row could be read" if scan.errors else "no rows"
        empty_problems.append(
            f"partition {partition.key} of {partition.source} is empty ({cause}); "
            "set allow_empty: true if that is expected"
        )

    bounds = f"[{partition.start.isoformat()}, {partition.end.isoformat()})"
    event_time_metadata: dict[str, object] = {**partition_metadata, "partition_window": MetadataValue.text(bounds)}
    event_time_problems = []
    if scan.min_ts is not None and scan.max_ts is not None:
        found = f"{scan.min_ts.isoformat()} .. {scan.max_ts.isoformat()}"
        event_time_metadata["event_time_range"] = MetadataValue.text(found)
        if scan.min_ts < partition.start or scan.max_ts >= partition.end:
            event_time_problems.append(f"rows with event time outside the partition {bounds}: found {found}")

    schema_metadata = {
        **partition_metadata,
        "schema_hash": MetadataValue.text(schema_hash(scan.schema) if scan.schema is not None else ""),
    }
    return [
        _result(asset_key, NO_UNREADABLE_FILES, _error_lines(read_errors), partition_metadata),
        _result(asset_key, SCHEMA_MATCHES_SPEC, _error_lines(schema_errors), schema_metadata),
        _result(asset_key, NOT_EMPTY, empty_problems, {**partition_metadata, "rows": MetadataValue.int(scan.rows)}),
        _result(asset_key, EVENT_TIMES_IN_PARTITION, event_time_problems, event_time_metadata),
    ]

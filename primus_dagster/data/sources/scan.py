"""Read a whole partition task by task, collecting statistics and per-task errors.

Used to validate a partition (source assets) and by benchmarks. Memory stays bounded:
batches are counted and dropped, only a small preview is kept.

Example::

    scan = scan_partition(adapter, adapter.partition(start))
    print(scan.rows, scan.arrow_bytes, scan.errors)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from primus_dagster.data.canonical import PermanentDataError
from primus_dagster.data.sources.base import Partition, ReadTask, SourceAdapter, SourceReadError


@dataclass
class PartitionScan:
    """What reading one partition found."""

    partition: Partition
    tasks: int = 0
    rows: int = 0
    arrow_bytes: int = 0
    labelled_rows: int = 0
    positives: int = 0
    min_ts: datetime | None = None
    max_ts: datetime | None = None
    schema: pa.Schema | None = None
    preview: pa.Table | None = None
    errors: list[tuple[str, str]] = field(default_factory=list)  # (uri, message)
    bad_records: int = 0  # undecodable records skipped (Kafka)
    bad_examples: list[dict] = field(default_factory=list)
    quality: Counter[str] = field(default_factory=Counter)  # rows touched per data-quality rule

    @property
    def ok(self) -> bool:
        return not self.errors


def _py_time(scalar: pa.TimestampScalar) -> datetime:
    """``scalar`` as a datetime; beyond Python's datetimes (a misread epoch unit): the nearest one."""
    try:
        return scalar.as_py()
    except (OverflowError, ValueError):
        return (datetime.max if scalar.value > 0 else datetime.min).replace(tzinfo=timezone.utc)


def _update(scan: PartitionScan, batch: pa.RecordBatch, preview_rows: int) -> None:
    scan.rows += batch.num_rows
    scan.arrow_bytes += batch.nbytes
    if scan.schema is None:
        scan.schema = batch.schema
    if batch.num_rows == 0:
        return
    label = batch.column("label")
    scan.labelled_rows += batch.num_rows - label.null_count
    scan.positives += int(pc.sum(pc.greater(label, 0)).as_py() or 0)
    bounds = pc.min_max(batch.column("ts"))
    lo, hi = _py_time(bounds["min"]), _py_time(bounds["max"])
    scan.min_ts = lo if scan.min_ts is None else min(scan.min_ts, lo)
    scan.max_ts = hi if scan.max_ts is None else max(scan.max_ts, hi)
    have = 0 if scan.preview is None else scan.preview.num_rows
    if have < preview_rows:
        head = pa.Table.from_batches([batch.slice(0, preview_rows - have)])
        scan.preview = head if scan.preview is None else pa.concat_tables([scan.preview, head])


def _take_quality(adapter: SourceAdapter) -> dict[str, int]:
    """The adapter's quality counts since the last call (none from a wrapper without a normaliser)."""
    normalize = getattr(adapter, "normalize", None)
    return normalize.take() if normalize is not None else {}


def scan_partition(
    adapter: SourceAdapter,
    partition: Partition,
    preview_rows: int = 5,
    on_task: Callable[[ReadTask, int, int], None] | None = None,
) -> PartitionScan:
    """Read every task of ``partition``; a failing task is recorded and the others still read.

    ``on_task(task, index, total)`` is called after each task (progress reporting).
    """
    scan = PartitionScan(partition)
    normalize = getattr(adapter, "normalize", None)  # as _take_quality: wrappers have none
    if normalize is not None:  # rows outside the partition, however many, are the event-time check's to report
        normalize.fail_on_misread_times = False
    tasks = adapter.split(partition)
    scan.tasks = len(tasks)
    _take_quality(adapter)
    for index, task in enumerate(tasks):
        try:
            for batch in adapter.read(task):
                _update(scan, batch, preview_rows)
        except (SourceReadError, PermanentDataError) as exc:
            scan.errors.append((task.uri, str(exc)))
        scan.quality.update(_take_quality(adapter))
        stats = adapter.last_read_stats
        scan.bad_records += int(stats.get("bad_records", 0))
        scan.bad_examples += list(stats.get("bad_examples", []))[: 10 - len(scan.bad_examples)]
        if on_task is not None:
            on_task(task, index + 1, len(tasks))
    return scan


def scan_problems(scan: PartitionScan, allow_empty: bool) -> list[str]:
    """Why a scanned partition is not valid (empty list: valid)."""
    problems = [f"{uri}: {message}" if not message.startswith(uri) else message for uri, message in scan.errors]
    if scan.rows == 0 and not allow_empty and not scan.errors:
        problems.append(
            f"partition {scan.partition.key} of {scan.partition.source} is empty "
            "(set allow_empty: true if that is expected)"
        )
    part = scan.partition
    if scan.min_ts is not None and scan.max_ts is not None and (scan.min_ts < part.start or scan.max_ts >= part.end):
        problems.append(
            f"rows with event time outside the partition [{part.start.isoformat()}, {part.end.isoformat()}): "
            f"found {scan.min_ts.isoformat()} .. {scan.max_ts.isoformat()}"
        )
    return problems

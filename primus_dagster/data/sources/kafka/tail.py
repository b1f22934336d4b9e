"""Open-ended stream ranges: from the committed offsets to the high watermarks, fixed when planned.

A live trainer does not wait for an hour to close: it reads what arrived since its last
checkpoint. :func:`plan_tail` turns the committed offset of each topic-partition (the next
offset to read, as Kafka commits it) and the partition's current bounds into read tasks
with explicit ``[start, stop)`` offsets. The stops are the high watermarks at planning time,
so re-running a planned task reads exactly the same records, and records that arrive later
belong to the next tail. Pure logic: the adapter supplies the bounds.

Example::

    plan = plan_tail("clicks_stream", "clicks", begins={0: 0, 1: 0}, highs={0: 950, 1: 910},
                     committed={0: 900, 1: 910}, max_records_per_task=200_000,
                     planned_at=now, granularity="hour")
    plan.lag                  # {0: 50, 1: 0}
    [(t.start, t.stop) for t in plan.tasks]   # [(900, 950)]
    plan.next_offsets         # {0: 950, 1: 910}: commit these once the tasks are trained on
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from primus_dagster.data.sources.base import ReadTask
from primus_dagster.spec.dataset import granularity_step


class TailOffsetError(ValueError):
    """Committed offsets that do not fit the topic: past its end, deleted by retention, or of unknown partitions."""


@dataclass(frozen=True)
class TailPlan:
    """Read tasks covering ``[starts[p], stops[p])`` of each topic-partition, and how far behind the reader is."""

    source: str
    topic: str
    planned_at: datetime
    starts: dict[int, int]
    stops: dict[int, int]  # the high watermarks when planned (or start + the per-partition limit)
    high_watermarks: dict[int, int]
    skipped: dict[int, int]  # offsets deleted by retention before they were read (skip_deleted=True only)
    tasks: list[ReadTask] = field(default_factory=list)

    @property
    def lag(self) -> dict[int, int]:
        """Records per partition between the start and the high watermark (what the reader is behind)."""
        return {p: self.high_watermarks[p] - s for p, s in self.starts.items()}

    @property
    def records(self) -> int:
        """Offsets the tasks cover (records, less any compacted away or transaction markers)."""
        return sum(self.stops[p] - s for p, s in self.starts.items())

    @property
    def next_offsets(self) -> dict[int, int]:
        """The offsets to commit once every task of the plan is consumed: the next tail starts there."""
        return dict(self.stops)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (for asset metadata and observations); tasks as their own dicts."""
        return {
            "source": self.source,
            "topic": self.topic,
            "planned_at": self.planned_at.isoformat(),
            "starts": {str(p): v for p, v in self.starts.items()},
            "stops": {str(p): v for p, v in self.stops.items()},
            "high_watermarks": {str(p): v for p, v in self.high_watermarks.items()},
            "lag": {str(p): v for p, v in self.lag.items()},
            "skipped": {str(p): v for p, v in self.skipped.items()},
            "tasks": [t.to_dict() for t in self.tasks],
        }


def plan_tail(
    source: str,
    topic: str,
    begins: dict[int, int],
    highs: dict[int, int],
    committed: dict[int, int] | None,
    max_records_per_task: int,
    planned_at: datetime,
    granularity: str,
    max_records_per_partition: int | None = None,
    skip_deleted: bool = False,
) -> TailPlan:
    """Tasks from ``committed`` (default: each partition's first retained offset) to the high watermarks ``highs``.

    Partitions missing from ``committed`` start at their first retained offset (a partition
    added to the topic is read from its start). A committed offset past the high watermark,
    or of a partition the topic does not have, raises :class:`TailOffsetError`; one below the
    first retained offset (deleted by retention) raises too unless ``skip_deleted``, which
    starts at the first retained offset and reports the gap in :attr:`TailPlan.skipped`.
    """
    committed = dict(committed or {})
    unknown = sorted(set(committed) - set(highs))
    if unknown:
        raise TailOffsetError(f"topic {topic!r} has no partitions {unknown} (it has {sorted(highs)})")
    starts, stops, skipped = {}, {}, {}
    for p in sorted(highs):
        begin, high = begins[p], highs[p]
        start = committed.get(p, begin)
        if start > high:
            raise TailOffsetError(
                f"{topic}:{p}: committed offset {start} is past the high watermark {high} "
                "(was the topic re-created, or are these offsets of another topic?)"
            )
        if start < begin:
            if not skip_deleted:
                raise TailOffsetError(
                    f"{topic}:{p}: offsets {start}..{begin} were deleted by retention before they were read; "
                    "pass skip_deleted=True to continue from the first retained offset (the gap is reported)"
                )
            skipped[p], start = begin - start, begin
        starts[p] = start
        stops[p] = high if max_records_per_partition is None else min(high, start + max_records_per_partition)
    planned_at = planned_at.astimezone(timezone.utc)
    step = granularity_step(granularity)
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    partition_start = epoch + ((planned_at - epoch) // step) * step  # the open partition the tail reads into
    tasks = []
    for p, start in starts.items():
        for s in range(start, stops[p], max_records_per_task):
            e = min(stops[p], s + max_records_per_task)
            tasks.append(ReadTask(source, partition_start, f"{topic}:{p}", s, e, rows=e - s, open_partition=True))
    return TailPlan(source, topic, planned_at, starts, stops, dict(highs), skipped, tasks)

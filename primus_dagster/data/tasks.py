"""Data tasks: what the planner (DTGG) emits, the driver hands out and executors run.

A :class:`DataTask` is one unit of hand-out: a read of one source task (file, row-group
range, pack of small files or Kafka offset range), or a join of a left read with the right reads that may hold
its late events. Its output is a deterministic sequence of canonical batches; a batch is
identified by ``(task_id, first_row)`` where ``first_row`` counts the task's output rows
from 0. Files are immutable and offsets stable, so re-running a task after a failure yields
the same batches with the same ids: that is what exactly-once delivery is built on.

Example::

    task = DataTask.for_read("history", "batch", read_task)
    again = DataTask.from_json(task.to_json())
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from primus_dagster.data.sources.base import ReadTask, pack_location


@dataclass(frozen=True)
class JoinInfo:
    """Join parameters of a join task: label = 1 when a right row with the same key exists
    with event time in ``[left ts, left ts + lateness]``; 0 once the lateness has passed."""

    left: str
    right: str
    key: str
    lateness_s: float


@dataclass(frozen=True)
class DataTask:
    """One unit of work handed out by the data driver (see module docstring)."""

    task_id: str
    stream: str
    kind: Literal["batch", "stream"]
    partition: datetime
    read: ReadTask
    right_reads: tuple[ReadTask, ...] = ()
    join: JoinInfo | None = None
    size_bytes: int = 0
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @classmethod
    def for_read(cls, stream: str, kind: Literal["batch", "stream"], read: ReadTask) -> DataTask:
        return cls(
            task_id=f"{stream}:{read.task_id}",
            stream=stream,
            kind=kind,
            partition=read.partition,
            read=read,
            size_bytes=read.size_bytes,
        )

    @property
    def units(self) -> int:
        """The files it reads (a pack: its files; anything else: 1): the failure threshold counts these."""
        return len(self.read.members) or 1

    def without(self, uris: Collection[str]) -> DataTask:
        """This pack without the files ``uris`` (given up): the same task id, fewer files to read."""
        read = self.read.without(uris)
        return replace(self, read=read, size_bytes=read.size_bytes)

    @property
    def order_key(self) -> tuple[str, str, str]:
        """Chronological hand-out order: partition time (or ``meta["order_at"]``, an ISO time: a
        lagged batch task is handed out beside the stream of its training time), then stream, then
        task id."""
        return (self.meta.get("order_at") or self.partition.isoformat(), self.stream, self.task_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "stream": self.stream,
            "kind": self.kind,
            "partition": self.partition.isoformat(),
            "read": self.read.to_dict(),
            "right_reads": [r.to_dict() for r in self.right_reads],
            "join": None if self.join is None else dict(self.join.__dict__),
            "size_bytes": self.size_bytes,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataTask:
        return cls(
            task_id=data["task_id"],
            stream=data["stream"],
            kind=data["kind"],
            partition=datetime.fromisoformat(data["partition"]),
            read=ReadTask.from_dict(data["read"]),
            right_reads=tuple(ReadTask.from_dict(r) for r in data.get("right_reads", [])),
            join=None if data.get("join") is None else JoinInfo(**data["join"]),
            size_bytes=int(data.get("size_bytes", 0)),
            meta=dict(data.get("meta") or {}),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DataTask:
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True)
class BatchId:
    """Identity of one served batch: rows ``[first_row, first_row + rows)`` of a task's output."""

    task_id: str
    first_row: int
    rows: int

    def key(self) -> str:
        return f"{self.task_id}@{self.first_row}"


def read_location(read: ReadTask, offsets: bool = False) -> str:
    """Where a read task's rows come from, for messages: its file (with the row-group range of a split
    file; a pack: its first file and how many more), or with ``offsets`` (a Kafka read: ``uri`` is
    ``topic:partition``) its topic, partition and offset range.

    >>> read_location(ReadTask("clicks", datetime(2026, 1, 1), "clicks:3", 100, 200), offsets=True)
    'topic clicks partition 3 offsets 100-200'
    """
    if offsets:
        topic, _, partition = read.uri.rpartition(":")
        return f"topic {topic} partition {partition} offsets {read.start}-{read.stop}"
    if read.members:
        return pack_location(read)
    if read.start == 0 and read.stop is None:
        return read.uri
    return f"{read.uri} row groups {read.start}-{read.stop}"

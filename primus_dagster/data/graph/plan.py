"""What a plan is: the ordered task list (lazy, compact), the partitions left out, the stats.

The Sink's output, :class:`TaskSequence`, is a ``Sequence[DataTask]`` in the exact order of
``sorted(tasks, key=DataTask.order_key)`` but holds only one :class:`Segment` per (stream,
source, partition) — a reference to a cached :class:`TaskBlock` — and builds each
:class:`DataTask` when it is read (a pack of small files is one task: :class:`PackRule`). A million-file plan therefore costs the blocks (shared
with the cache) plus a few hundred bytes a partition, not ~600 bytes a task; consumers that
want objects call ``list(plan.tasks)``.

Ordering argument: a DataTask's ``order_key`` is ``(partition iso, stream, task_id)`` with
``task_id = f"{stream}:{source}/{partition:%Y%m%dT%H}/{uri}{span}"``. Segments are sorted by
``(partition iso, stream, source + "/")`` and a block's tasks by ``uri + span``; since names
contain no ``/``, every task id of one segment sorts before every task id of the next. A pack's id
is its first file's with ``+<files after it>`` for the span, and packs keep the block's order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Literal, overload

from primus_dagster.data.graph.listing_cache import PackRule, TaskBlock
from primus_dagster.data.graph.ops import TaskGraph
from primus_dagster.data.sources.base import ReadTask, TimeWindow
from primus_dagster.data.tasks import DataTask, JoinInfo

NotReadyState = Literal["not_ready", "waiting", "error"]
"""Why a partition is left out of a plan (:attr:`NotReady.state`)."""


@dataclass(frozen=True)
class Segment:
    """The tasks one consumer gets from one partition (a block), as read or join tasks; with a ``pack``
    rule, consecutive small files are one task (:meth:`TaskBlock.pack_cuts`)."""

    stream: str
    kind: Literal["batch", "stream"]
    source: str
    block: TaskBlock
    join: JoinInfo | None = None
    right: tuple[TaskBlock, ...] = ()  # the right source's blocks covering [start, end + lateness)
    pack: PackRule | None = None

    @property
    def sort_key(self) -> tuple[str, str, str]:
        return (self.block.partition.isoformat(), self.stream, self.source + "/")

    def __len__(self) -> int:
        if self.pack is None:
            return len(self.block)
        return max(0, len(self.block.pack_cuts(self.pack)) - 1)

    def right_reads(self) -> tuple[ReadTask, ...]:
        if self.join is None:
            return ()
        return tuple(task for block in self.right for task in block.read_tasks(self.join.right))

    def read(self, i: int) -> ReadTask:
        """The read of task ``i``: a file (or row-group range) of the block, or a pack of its files."""
        if self.pack is None:
            return self.block.read_task(i, self.source)
        cuts = self.block.pack_cuts(self.pack)
        return self.block.read_pack(cuts[i], cuts[i + 1], self.source)

    def task(self, i: int, right_reads: tuple[ReadTask, ...] | None = None) -> DataTask:
        read = self.read(i)
        if self.join is None:
            return DataTask.for_read(self.stream, self.kind, read)
        return DataTask(
            task_id=f"{self.stream}:{read.task_id}",
            stream=self.stream,
            kind=self.kind,
            partition=read.partition,
            read=read,
            right_reads=self.right_reads() if right_reads is None else right_reads,
            join=self.join,
            size_bytes=read.size_bytes,
        )

    def tasks(self) -> Iterator[DataTask]:
        right = self.right_reads()  # shared by the segment's join tasks
        for i in range(len(self)):
            yield self.task(i, right)


class TaskSequence(Sequence[DataTask]):
    """The Sink's ordered task list, materialised task by task (see module docstring)."""

    def __init__(self, segments: list[Segment]):
        self.segments: tuple[Segment, ...] = tuple(sorted(segments, key=lambda s: s.sort_key))
        self._ends = list(accumulate(len(s) for s in self.segments))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[DataTask]:
        for segment in self.segments:
            yield from segment.tasks()

    @overload
    def __getitem__(self, index: int) -> DataTask: ...

    @overload
    def __getitem__(self, index: slice) -> list[DataTask]: ...

    def __getitem__(self, index: int | slice) -> DataTask | list[DataTask]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"task index {index} out of range for {n} tasks")
        k = bisect_right(self._ends, index)
        first = self._ends[k - 1] if k else 0
        return self.segments[k].task(index - first)

    def __repr__(self) -> str:
        return f"TaskSequence({len(self)} tasks in {len(self.segments)} segments)"


@dataclass(frozen=True)
class NotReady:
    """A partition left out of the plan, and why.

    ``state``: ``not_ready`` (the source says so), ``waiting`` (a join's left partition whose
    right side is not ready up to end + lateness) or ``error`` (listing / splitting failed).
    """

    stream: str
    source: str
    partition: Any  # datetime
    reason: str
    state: NotReadyState = "not_ready"

    def to_dict(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "source": self.source,
            "partition": self.partition.isoformat(),
            "state": self.state,
            "reason": self.reason,
        }


@dataclass
class ConsumerCount:
    """Per ``(stream, source)``: tasks, bytes and partitions of this plan."""

    tasks: int = 0
    bytes: int = 0
    ready_partitions: int = 0
    not_ready_partitions: int = 0


@dataclass
class PlanStats:
    listings: int = 0  # adapter.partitions() calls
    listed_partitions: int = 0  # partitions those calls returned
    cache_hits: int = 0  # (op, partition) pairs answered by the cache
    version_calls: int = 0
    files: int = 0  # distinct read units listed (fused sources count once)
    tasks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    threads: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, seconds=round(self.seconds, 4))


@dataclass
class Plan:
    """The planner's answer for one window: ordered tasks, what is left out, counts, stats."""

    window: TimeWindow
    graph: TaskGraph
    tasks: TaskSequence
    not_ready: list[NotReady] = field(default_factory=list)
    counts: dict[tuple[str, str], ConsumerCount] = field(default_factory=dict)
    stats: PlanStats = field(default_factory=PlanStats)

    def to_dict(self, with_tasks: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "window": {"start": self.window.start.isoformat(), "end": self.window.end.isoformat()},
            "graph": self.graph.to_dict(),
            "counts": [{"stream": s, "source": n, **c.__dict__} for (s, n), c in self.counts.items()],
            "not_ready": [p.to_dict() for p in self.not_ready],
            "stats": self.stats.to_dict(),
        }
        if with_tasks:
            out["tasks"] = [t.to_dict() for t in self.tasks]
        return out

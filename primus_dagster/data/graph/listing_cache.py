"""Compact storage of listed partitions: :class:`TaskBlock` and the :class:`ListingCache`.

A ready partition is immutable (Parquet: its success marker is written last; Delta / Iceberg:
its files are pinned to a table version; Kafka: the offsets of a passed hour), so its read
tasks can be cached and reused when the window slides. Planning millions of files must stay
in bounded memory, so a partition's tasks are kept column-wise — the file names (after their
common directory) as one string with an offsets array, one ``array('q')`` of sizes, optional
spans / rows / versions only when they vary — about 20-40 bytes a file instead of ~280 for a
``ReadTask`` object.
:class:`ReadTask` objects are rebuilt on demand (:meth:`TaskBlock.read_task`), under any
consumer's source name, which is what lets fused sources share one listing, or as packs of small
files (:class:`PackRule`, :meth:`TaskBlock.pack_cuts`).

Example::

    block = TaskBlock.from_tasks(part.start, part.version, adapter.split(part))
    cache = ListingCache()
    cache.put(op.key, part.start, part.version, block)
    cache.get(op.key, part.start, part.version).read_task(0, "impressions_parquet")
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate
from typing import Any

from primus_dagster.data.sources.base import ReadTask


def task_suffix(task: ReadTask) -> str:
    """The part of ``task.task_id`` after ``source/partition/``: ``uri`` plus its span, if any."""
    if task.start == 0 and task.stop is None:
        return task.uri
    return f"{task.uri}#{task.start}-{task.stop}"


@dataclass(frozen=True)
class PackRule:
    """How the DTGG packs a partition's small files into one task: Spark's ``maxPartitionBytes`` /
    ``openCostInBytes`` rule, keeping the files' order. A file costs its size plus ``open_cost_bytes``;
    consecutive whole files of one table version go into one pack while their costs add up to at most
    ``pack_bytes``, so a pack holds at most ``pack_bytes // open_cost_bytes`` files and a file of
    ``pack_bytes - open_cost_bytes`` or more stays a task of its own (as does a row-group range).

    Example::

        rule = PackRule(pack_bytes=128 * 2**20, open_cost_bytes=4 * 2**20)   # data.pack_bytes, data.open_cost_bytes
        block.pack_cuts(rule)   # array('q', [0, 32, 64, ..., len(block)]): pack k is files cuts[k]..cuts[k+1]
    """

    pack_bytes: int
    open_cost_bytes: int

    def __post_init__(self) -> None:
        if self.pack_bytes < 0 or self.open_cost_bytes < 0:
            raise ValueError(f"bad pack rule: pack_bytes={self.pack_bytes}, open_cost_bytes={self.open_cost_bytes}")


class TaskBlock:
    """The read tasks of one ready partition, column-wise, ordered like their task ids.

    File names are kept as one string (``blob``, after the common directory ``prefix``) cut
    at ``offsets``: no small object per file survives planning, so the memory a large plan
    holds is ~20-40 bytes a file and the allocator's arenas of the listing garbage are freed.
    """

    __slots__ = (
        "_packs",
        "blob",
        "offsets",
        "partition",
        "prefix",
        "rows",
        "sizes",
        "spans",
        "task_version",
        "version",
        "versions",
    )

    def __init__(
        self,
        partition: datetime,
        version: str | None,
        prefix: str,
        names: Sequence[str],
        sizes: array,
        spans: tuple[tuple[int, int | None], ...] | None = None,
        rows: tuple[int | None, ...] | None = None,
        task_version: str | None = None,
        versions: tuple[str | None, ...] | None = None,
    ):
        if len(names) != len(sizes):
            raise ValueError(f"{len(names)} names but {len(sizes)} sizes")
        self.partition = partition
        self.version = version
        self.prefix = prefix
        self.blob = "".join(names)
        self.offsets = array("Q", accumulate(map(len, names), initial=0))
        self.sizes = sizes
        self.spans = spans
        self.rows = rows
        self.task_version = task_version
        self.versions = versions
        self._packs: tuple[PackRule, array] | None = None  # the last rule's pack_cuts

    @classmethod
    def from_tasks(cls, partition: datetime, version: str | None, tasks: Sequence[ReadTask]) -> TaskBlock:
        """Pack ``tasks`` (one partition's) sorted by task id; the ``source`` field is dropped."""
        tasks = sorted(tasks, key=task_suffix)
        uris = [t.uri for t in tasks]
        prefix = ""
        if uris:
            head = uris[0].rpartition("/")[0]
            if head and all(u.startswith(head + "/") for u in uris):
                prefix = head + "/"
        cut = len(prefix)
        names = [u[cut:] for u in uris] if cut else uris
        whole = all(t.start == 0 and t.stop is None for t in tasks)
        spans = None if whole else tuple((t.start, t.stop) for t in tasks)
        rows = None if all(t.rows is None for t in tasks) else tuple(t.rows for t in tasks)
        task_versions = {t.version for t in tasks}
        task_version = next(iter(task_versions)) if len(task_versions) == 1 else None
        versions = None if len(task_versions) <= 1 else tuple(t.version for t in tasks)
        return cls(
            partition,
            version,
            prefix,
            names,
            array("q", [t.size_bytes for t in tasks]),
            spans,
            rows,
            task_version,
            versions,
        )

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def bytes(self) -> int:
        return sum(self.sizes)

    def uri(self, i: int) -> str:
        return self.prefix + self.blob[self.offsets[i] : self.offsets[i + 1]]

    def read_task(self, i: int, source: str) -> ReadTask:
        """Task ``i`` as a :class:`ReadTask` of consumer ``source``."""
        start, stop = (0, None) if self.spans is None else self.spans[i]
        return ReadTask(
            source,
            self.partition,
            self.uri(i),
            start,
            stop,
            self.sizes[i],
            None if self.rows is None else self.rows[i],
            self.task_version if self.versions is None else self.versions[i],
        )

    def read_tasks(self, source: str) -> Iterator[ReadTask]:
        for i in range(len(self.sizes)):
            yield self.read_task(i, source)

    def _version(self, i: int) -> str | None:
        return self.task_version if self.versions is None else self.versions[i]

    def pack_cuts(self, rule: PackRule) -> array:
        """Where ``rule`` cuts this block's tasks into packs: pack ``k`` is tasks ``cuts[k]`` to ``cuts[k + 1]``
        (one task: not a pack); the last rule's cuts are kept (blocks are shared by the plans of a sliding
        window)."""
        if self._packs is not None and self._packs[0] == rule:
            return self._packs[1]
        n = len(self.sizes)
        cuts = array("q", [0])
        cost, alone = 0, False
        for i in range(n):
            whole = self.spans is None or self.spans[i] == (0, None)
            size = self.sizes[i] + rule.open_cost_bytes
            if i > cuts[-1] and (
                alone or not whole or cost + size > rule.pack_bytes or self._version(i) != self._version(cuts[-1])
            ):
                cuts.append(i)
                cost = 0
            cost += size
            alone = not whole
        if n:
            cuts.append(n)
        self._packs = (rule, cuts)
        return cuts

    def read_pack(self, lo: int, hi: int, source: str) -> ReadTask:
        """Tasks ``lo`` to ``hi`` (whole files of one version) as one pack of consumer ``source``; a single
        task as itself."""
        if hi - lo == 1:
            return self.read_task(lo, source)
        members = tuple(
            (self.uri(i), self.sizes[i], None if self.rows is None else self.rows[i]) for i in range(lo, hi)
        )
        rows = None if any(m[2] is None for m in members) else sum(m[2] or 0 for m in members)
        return ReadTask(
            source,
            self.partition,
            members[0][0],
            size_bytes=sum(m[1] for m in members),
            rows=rows,
            version=self._version(lo),
            members=members,
        )


CacheKey = tuple[Hashable, datetime, "str | None"]


class ListingCache:
    """Thread-safe LRU of ready partitions' :class:`TaskBlock`, keyed by
    ``(fusion key, partition start, version)`` and bounded by the files it holds.

    Only ready partitions belong here (they are immutable); ``max_files`` bounds memory
    (~20-40 bytes a file: the default 8 M files is a few hundred MiB).
    """

    def __init__(self, max_files: int = 8_000_000):
        self.max_files = max_files
        self._blocks: OrderedDict[CacheKey, TaskBlock] = OrderedDict()
        self._lock = threading.Lock()
        self.files = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key: Hashable, start: datetime, version: str | None) -> TaskBlock | None:
        with self._lock:
            block = self._blocks.get((key, start, version))
            if block is None:
                self.misses += 1
                return None
            self._blocks.move_to_end((key, start, version))
            self.hits += 1
            return block

    def put(self, key: Hashable, start: datetime, version: str | None, block: TaskBlock) -> None:
        with self._lock:
            old = self._blocks.pop((key, start, version), None)
            if old is not None:
                self.files -= len(old)
            self._blocks[(key, start, version)] = block
            self.files += len(block)
            while self.files > self.max_files and len(self._blocks) > 1:
                _, evicted = self._blocks.popitem(last=False)
                self.files -= len(evicted)
                self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self.files = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    def stats(self) -> dict[str, Any]:
        return {
            "partitions": len(self._blocks),
            "files": self.files,
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
        }

"""The one protocol every source adapter implements, and the value types it trades in.

An adapter can (a) list the partitions of a time window and say which are ready,
(b) split a partition into read tasks (file / row-group ranges, offset ranges) and
(c) read one task as a stream of canonical Arrow record batches (bounded memory).

Example::

    adapter = make_adapter(source_spec, SourceContext(data_root="/data"))
    for part in adapter.ready_partitions(TimeWindow.hours_from(start, 1)):
        for task in adapter.split(part):
            for batch in adapter.read(task):
                ...
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa

from primus_dagster.data.canonical import Normalizer
from primus_dagster.spec.dataset import granularity_step
from primus_dagster.spec.inputs import partition_starts
from primus_dagster.spec.sources import (
    PathOutsideRootError,
    SourceSpec,
    is_local_location,
    local_path,
    outside_root,
)


class SourceReadError(RuntimeError):
    """Reading one task failed; the message names the file / topic-partition and the cause."""

    def __init__(self, uri: str, message: str):
        self.uri = uri
        super().__init__(f"{uri}: {message}")


class PartitionNotReadyError(RuntimeError):
    """A partition was asked for before its data is complete (no marker, no data yet)."""


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


@dataclass(frozen=True)
class TimeWindow:
    """Half-open UTC time range ``[start, end)``."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", _utc(self.start))
        object.__setattr__(self, "end", _utc(self.end))
        if self.end <= self.start:
            raise ValueError(f"empty time window: {self.start.isoformat()} .. {self.end.isoformat()}")

    @classmethod
    def hours_from(cls, start: datetime, hours: int) -> TimeWindow:
        return cls(start, _utc(start) + timedelta(hours=hours))

    def partition_starts(self, granularity: str) -> list[datetime]:
        """Starts of the ``hour``/``day`` partitions overlapping the window, in order
        (:func:`primus_dagster.spec.partition_starts`)."""
        return partition_starts(self, granularity)

    def __str__(self) -> str:
        return f"[{self.start:%Y-%m-%dT%H:%M}Z, {self.end:%Y-%m-%dT%H:%M}Z)"


@dataclass(frozen=True)
class Partition:
    """One time partition of a source, as listed by its adapter."""

    source: str
    start: datetime
    end: datetime
    ready: bool
    location: str
    version: str | None = None
    files: int = 0
    bytes: int | None = None
    rows: int | None = None
    reason: str | None = None  # why it is not ready
    detail: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.start:%Y-%m-%d-%H:%M}"


@dataclass(frozen=True)
class ReadTask:
    """The unit of work a data executor reads: a file (or its row-group range) or an offset range.

    ``start``/``stop`` are row-group indices for files and offsets for Kafka (``stop`` exclusive;
    None: to the end of the file). Tasks are plain data so they can travel as JSON.
    """

    source: str
    partition: datetime
    uri: str
    start: int = 0
    stop: int | None = None
    size_bytes: int = 0
    rows: int | None = None
    version: str | None = None
    # A live tail's range: its rows may lie before the partition it is dated in (no event-time check).
    open_partition: bool = False

    @property
    def event_partition(self) -> datetime | None:
        """The start of the partition its rows' event times must lie in (None for a live tail)."""
        return None if self.open_partition else self.partition

    @property
    def task_id(self) -> str:
        span = "" if (self.start == 0 and self.stop is None) else f"#{self.start}-{self.stop}"
        return f"{self.source}/{self.partition:%Y%m%dT%H}/{self.uri}{span}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (no deep copy: every field is a scalar; snapshots hold millions)."""
        out: dict[str, Any] = {
            "source": self.source,
            "partition": self.partition.isoformat(),
            "uri": self.uri,
            "start": self.start,
            "stop": self.stop,
            "size_bytes": self.size_bytes,
            "rows": self.rows,
            "version": self.version,
        }
        if self.open_partition:
            out["open_partition"] = True
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReadTask:
        return cls(**{**data, "partition": datetime.fromisoformat(data["partition"])})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReadTask:
        return cls.from_dict(json.loads(text))


@dataclass
class SourceContext:
    """Where relative locations resolve and which Kafka to use when a source names none."""

    data_root: str = "."
    kafka_bootstrap_servers: str | None = None

    def resolve(self, location: str) -> str:
        """Absolute path/URL for ``location``: URLs and absolute paths are returned as they are (the explicit
        opt-out); a relative path is joined to the data root and may not leave it (:class:`PathOutsideRootError`
        on ``..`` and on a relative ``file://`` URI; symlinks are checked when listing: :meth:`guard`).

        >>> SourceContext("/data").resolve("parquet/clicks")
        '/data/parquet/clicks'
        """
        problem = outside_root(location, what=f"the data root {self.data_root!r}")
        if problem is not None:
            raise PathOutsideRootError(f"{problem}; use a path inside it, or an absolute path / URL")
        if not is_local_location(location) or local_path(location).startswith("/"):
            return location
        return f"{self.data_root.rstrip('/')}/{location}"

    def root_of(self, location: str) -> str | None:
        """What files found under ``location`` must stay inside: the data root for a relative location, the
        location itself for an absolute one (the spec's explicit opt-out), None for object stores."""
        if not is_local_location(location):
            return None
        if local_path(location).startswith("/"):
            return local_path(location)
        return self.data_root if is_local_location(self.data_root) else None

    def guard(self, source: str, location: str) -> ListingGuard:
        """The :class:`ListingGuard` of the files a listing of ``location`` (a source's spec location) finds."""
        root = self.root_of(location)
        what = "the data root" if root == self.data_root else "the source location"
        return ListingGuard(source, root, what)


class ListingGuard:
    """Refuses a listed file (or directory) that resolves outside its source's root (:func:`outside_root`,
    symlinks followed): :class:`PathOutsideRootError` naming the source, the file, the link and its target.

    A directory is resolved once; a file in a directory inside the root costs one ``lstat`` (only a
    symlink is resolved), so listing thousands of files stays cheap.

    Example::

        guard = SourceContext("/data").guard("clicks", "parquet/clicks")
        guard.check("/data/parquet/clicks/dt=2026-11-01/hour=05/part-0.parquet")
    """

    def __init__(self, source: str, root: str | None, what: str = "the data root"):
        self.source, self.root, self.what = source, root, what
        self._inside: set[str] = set()  # directories known to resolve inside the root

    def check(self, found: str) -> None:
        """Raise :class:`PathOutsideRootError` when ``found`` (a local path or ``file://`` URI) leaves the root."""
        if self.root is None or not is_local_location(found):
            return
        path = local_path(found)
        if os.path.normpath(path) == os.path.normpath(local_path(self.root)):
            return  # the root itself (an absolute location, or a table at the data root)
        parent = os.path.dirname(path)
        if parent in self._inside and not os.path.islink(path):
            return  # in a directory inside the root, and not a link: inside
        problem = outside_root(path, self.root, self.what)
        if problem is not None:
            raise PathOutsideRootError(f"source {self.source!r}: listed file {problem}")
        if outside_root(parent, self.root, self.what) is None:
            self._inside.add(parent)


class SourceAdapter(abc.ABC):
    """Base class of the four adapters; subclasses implement partitions, split and read."""

    def __init__(self, spec: SourceSpec, context: SourceContext):
        self.spec = spec
        self.context = context
        self.normalize = Normalizer(spec)
        # Set by read(): what the last task met besides rows (e.g. Kafka's bad_records).
        self.last_read_stats: dict[str, Any] = {}

    @abc.abstractmethod
    def partitions(self, window: TimeWindow) -> list[Partition]:
        """Every partition overlapping ``window``, ready or not, in time order."""

    @abc.abstractmethod
    def split(self, partition: Partition) -> list[ReadTask]:
        """The read tasks of one ready partition."""

    @abc.abstractmethod
    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """Canonical record batches of one task, streamed; raises :class:`SourceReadError`."""

    def project(self, fields: Iterable[str] | None, constants: bool = True) -> SourceAdapter:
        """Read only the canonical ``fields`` from now on (see :class:`Normalizer`; adapters whose
        storage is columnar then skip the native columns of the fields left out), without the
        constant ``source``/``kind`` columns unless ``constants``; returns ``self``."""
        self.normalize = Normalizer(self.spec, fields=fields, constants=constants)
        return self

    def version(self) -> str | None:
        """Current table version / snapshot id, when the storage has one."""
        return None

    def ready_partitions(self, window: TimeWindow) -> list[Partition]:
        return [p for p in self.partitions(window) if p.ready]

    def partition(self, start: datetime) -> Partition:
        """The single partition starting at ``start``."""
        step = granularity_step(self.spec.granularity)
        (part,) = self.partitions(TimeWindow(start, _utc(start) + step))
        return part

    def close(self) -> None:
        """Release connections (Kafka consumers, catalogs); the default adapter holds none."""
        return None

    def __enter__(self) -> SourceAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

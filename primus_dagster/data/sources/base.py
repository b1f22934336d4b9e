"""The one protocol every source adapter implements, and the value types it trades in.

An adapter can (a) list the partitions of a time window and say which are ready,
(b) split a partition into read tasks (file / row-group ranges, offset ranges) and
(c) read one task as a stream of canonical Arrow record batches (bounded memory).

A file source's task may be a *pack* (:attr:`ReadTask.members`: several small files of one partition,
planned by the DTGG): :meth:`SourceAdapter.read_pack` reads its files one after the other and
normalises their rows in batches of ``batch_rows`` across file boundaries (one normaliser call per
batch, not per file). A file that cannot be read, or does not fit the spec, raises an error naming it (its type kept)
with a :class:`PackFailure` (:func:`pack_failure`) -- before any batch holding rows of it or of a
later file was handed out -- so that the driver can give up that file alone (``docs/data_plane.md``,
"Packs").

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
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa

from primus_dagster.data.canonical import Normalizer, PermanentDataError
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


@dataclass(frozen=True)
class PackFailure:
    """What :meth:`SourceAdapter.read_pack` attaches to the error of one file of a pack (:func:`pack_failure`):
    the file (``member``) and ``served_members`` -- the batches of the read handed out before hold rows of the
    pack's first ``served_members`` files only (they were all cut while those files were read), none of
    ``member``'s or a later file's."""

    member: str
    served_members: int


_PACK_FAILURE = "primus_pack_failure"


def pack_failure(exc: BaseException) -> PackFailure | None:
    """The :class:`PackFailure` of an error raised by a pack's read (None: not one file's failure).

    The error keeps its type (a :class:`SchemaMismatchError` stays one: callers that tell errors apart by type
    work on packs unchanged) and names the file."""
    found = getattr(exc, _PACK_FAILURE, None)
    return found if isinstance(found, PackFailure) else None


def _pinned(exc: Exception, member: str, served: int) -> Exception:
    """``exc`` (wrapped in a :class:`SourceReadError` when its message does not name ``member``) with its
    :class:`PackFailure`."""
    if member not in str(exc):
        exc = SourceReadError(member, f"{type(exc).__name__}: {exc}")
    setattr(exc, _PACK_FAILURE, PackFailure(member, served))
    return exc


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


Member = tuple[str, int, "int | None"]
"""One file of a pack (:attr:`ReadTask.members`): its uri, size in bytes and rows (None: not known)."""


@dataclass(frozen=True)
class ReadTask:
    """The unit of work a data executor reads: a file (or its row-group range), a pack of whole files
    of one partition (``members``; ``uri`` is the first one's) or an offset range.

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
    members: tuple[Member, ...] = ()  # a pack: its files in order (empty: one file or range)

    @property
    def event_partition(self) -> datetime | None:
        """The start of the partition its rows' event times must lie in (None for a live tail)."""
        return None if self.open_partition else self.partition

    @property
    def task_id(self) -> str:
        if self.members:  # named by its first file and how many follow it
            span = f"+{len(self.members) - 1}"
        else:
            span = "" if (self.start == 0 and self.stop is None) else f"#{self.start}-{self.stop}"
        return f"{self.source}/{self.partition:%Y%m%dT%H}/{self.uri}{span}"

    def member_tasks(self) -> list[ReadTask]:
        """A pack's files, each as the whole-file task it would be on its own."""
        return [
            ReadTask(self.source, self.partition, uri, 0, None, size, rows, self.version)
            for uri, size, rows in self.members
        ]

    def without(self, uris: Collection[str]) -> ReadTask:
        """This pack without the files ``uris`` (given up); ``uri`` becomes the first file left."""
        kept = tuple(m for m in self.members if m[0] not in uris)
        if not kept:
            raise ValueError(f"pack {self.task_id}: no file left without {sorted(uris)}")
        rows = None if any(m[2] is None for m in kept) else sum(m[2] or 0 for m in kept)
        return replace(self, uri=kept[0][0], size_bytes=sum(m[1] for m in kept), rows=rows, members=kept)

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
        if self.members:
            out["members"] = _members_text(self.members)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReadTask:
        members = _members_of(data["members"]) if data.get("members") else ()
        return cls(**{**data, "partition": datetime.fromisoformat(data["partition"]), "members": members})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReadTask:
        return cls.from_dict(json.loads(text))


def _members_text(members: tuple[Member, ...]) -> str:
    """A pack's files as one JSON text ``[directory, [[name, size, rows], ...]]``: a snapshot holding thousands
    of them stays small, and one string per pack keeps an indented dump of it fast."""
    head = members[0][0].rpartition("/")[0] + "/"
    if not all(uri.startswith(head) for uri, _, _ in members):
        head = ""
    files = [[uri[len(head) :], size, rows] for uri, size, rows in members]
    return json.dumps([head, files], separators=(",", ":"))


def _members_of(text: str) -> tuple[Member, ...]:
    head, files = json.loads(text)
    return tuple((head + str(name), int(size), None if rows is None else int(rows)) for name, size, rows in files)


def pack_location(read: ReadTask) -> str:
    """A pack's files for messages: its first file and how many more.

    >>> pack_location(ReadTask("imp", datetime(2026, 1, 1), "/d/a.parquet", members=(("/d/a.parquet", 9, 1),
    ...     ("/d/b.parquet", 9, 1))))
    '/d/a.parquet and 1 more file(s) of its partition (a pack of 2)'
    """
    return f"{read.uri} and {len(read.members) - 1} more file(s) of its partition (a pack of {len(read.members)})"


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

    def open_file(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """The native (not normalised) batches of one whole-file task, for :meth:`read_pack`; file sources
        implement it (a failure to open may raise here or at the first batch)."""
        raise NotImplementedError(f"{type(self).__name__} has no files to pack")

    def read_files(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """:meth:`read` of a file source: a pack through :meth:`read_pack`, a file (or its row-group range)
        through :meth:`open_file`, normalised batch by batch."""
        if task.members:
            yield from self.read_pack(task)
            return
        for batch in self.open_file(task):
            yield self.normalize(batch, where=task.uri, partition=task.event_partition)

    def read_pack(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """The canonical batches of a pack (``task.members``): its files' native rows in order, normalised in
        batches of ``batch_rows`` that run across file boundaries (a batch ends early only where the next file's
        native schema differs), so the batches are the same on every read of the same files.

        A file that fails -- to open, to decode, or to normalise (a schema or a data-quality ``fail``) --
        raises an error naming it with a :class:`PackFailure`: every batch handed out before was cut while
        an earlier file was read, so it holds no row of this file or a later one, and a read without this
        file yields the same batches up to there. ``last_read_stats["quality_places"]``:
        rows touched per quality rule, per file (``{uri: {rule: rows}}``)."""
        rows = self.spec.batch_rows
        members = task.member_tasks()
        places: dict[str, Counter[str]] = {}
        self.last_read_stats = {"quality_places": places}
        held: list[tuple[int, pa.RecordBatch]] = []  # native batches read and not yet handed out, with their file
        held_rows = 0
        served = 0  # 1 + the file being read when a batch was last handed out
        for index, member in enumerate(members):
            natives: Iterator[pa.RecordBatch] | None = None
            while True:
                try:
                    natives = natives or iter(self.open_file(member))
                    native = next(natives)
                except StopIteration:
                    break
                except Exception as exc:  # any failure reading a file is this file's
                    pinned = _pinned(exc, member.uri, served)
                    raise pinned from (exc if pinned is not exc else exc.__cause__)
                if not native.num_rows:
                    continue
                if held and native.schema != held[-1][1].schema:  # one schema per normaliser call
                    out = self._normalize_pack(task, members, held, places, served)
                    held, held_rows, served = [], 0, index + 1
                    yield out
                held.append((index, native))
                held_rows += native.num_rows
                while held_rows >= rows:
                    chunk, held = _cut(held, rows)
                    held_rows -= rows
                    out = self._normalize_pack(task, members, chunk, places, served)
                    served = index + 1
                    yield out
        if held:
            yield self._normalize_pack(task, members, held, places, served)

    def _normalize_pack(
        self,
        task: ReadTask,
        members: list[ReadTask],
        chunk: list[tuple[int, pa.RecordBatch]],
        places: dict[str, Counter[str]],
        served: int,
    ) -> pa.RecordBatch:
        """One normaliser call over ``chunk`` (native batches of one schema, each with its file's index); the
        quality counts it adds are split per file, a permanent error is pinned on its file."""
        native = chunk[0][1] if len(chunk) == 1 else pa.concat_batches([b for _, b in chunk])
        before = Counter(self.normalize.counts)
        try:
            out = self.normalize(native, where=pack_location(task), partition=task.event_partition)
        except PermanentDataError as exc:
            for index, alone in _by_file(chunk):
                try:
                    self._side_normalizer()(alone, where=members[index].uri, partition=task.event_partition)
                except PermanentDataError as own:
                    raise _pinned(own, members[index].uri, served) from exc
            raise exc  # only the files together break a rule: the pack fails as a whole
        added = Counter(self.normalize.counts)
        added.subtract(before)
        if any(added.values()):
            files = _by_file(chunk)
            if len(files) == 1:
                places.setdefault(members[files[0][0]].uri, Counter()).update(+added)
            else:  # rare (repaired or dropped rows): which file's rows they were, one file at a time
                side = self._side_normalizer()
                for index, alone in files:
                    side(alone, where=members[index].uri, partition=task.event_partition)
                    if counted := side.take():
                        places.setdefault(members[index].uri, Counter()).update(counted)
        return out

    def _side_normalizer(self) -> Normalizer:
        """A normaliser like :attr:`normalize` whose counts are not the task's (to tell files apart)."""
        side = Normalizer(self.spec, fields=self.normalize.fields, constants=self.normalize.constants)
        side.fail_on_misread_times = self.normalize.fail_on_misread_times
        return side

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


def _cut(held: list[tuple[int, pa.RecordBatch]], rows: int) -> tuple[list[tuple[int, pa.RecordBatch]], list]:
    """The first ``rows`` rows of ``held`` and the rest (a batch split where the cut falls)."""
    chunk: list[tuple[int, pa.RecordBatch]] = []
    need = rows
    for i, (index, batch) in enumerate(held):
        if batch.num_rows <= need:
            chunk.append((index, batch))
            need -= batch.num_rows
            if need == 0:
                return chunk, held[i + 1 :]
            continue
        chunk.append((index, batch.slice(0, need)))
        return chunk, [(index, batch.slice(need)), *held[i + 1 :]]
    return chunk, []


def _by_file(chunk: list[tuple[int, pa.RecordBatch]]) -> list[tuple[int, pa.RecordBatch]]:
    """``chunk``'s rows grouped by file (files are consecutive in a chunk), one batch each."""
    groups: list[tuple[int, list[pa.RecordBatch]]] = []
    for index, batch in chunk:
        if groups and groups[-1][0] == index:
            groups[-1][1].append(batch)
        else:
            groups.append((index, [batch]))
    return [(index, parts[0] if len(parts) == 1 else pa.concat_batches(parts)) for index, parts in groups]

"""Parquet files on any fsspec filesystem, one directory per hour or day.

Layouts: ``hive`` (``dt=YYYY-MM-DD/hour=HH``; daily: ``dt=YYYY-MM-DD``) or a path template
(``{YYYY}{MM}{DD}/{HH}``). With a success marker configured (default ``_SUCCESS``), a
directory without its marker is listed but not ready. Files whose names start with ``_`` or
``.`` are never data. A listed data file that resolves outside the source's root (a symlink out of
the data root) fails the listing (:class:`ListingGuard`); a symlink inside it is read as its target.

Example::

    src = ParquetSource(spec, SourceContext(data_root="/data"))
    part = src.partition(datetime(2026, 11, 1, 5, tzinfo=timezone.utc))
    batches = [b for t in src.split(part) for b in src.read(t)]
"""

from __future__ import annotations

import functools
import mmap
import os
from collections.abc import Iterable, Iterator
from datetime import datetime
from stat import S_ISREG
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from primus_dagster.data.canonical import SchemaMismatchError, native_columns
from primus_dagster.data.sources.base import (
    Partition,
    ReadTask,
    SourceAdapter,
    SourceContext,
    SourceReadError,
    TimeWindow,
)
from primus_dagster.spec.dataset import granularity_step
from primus_dagster.spec.sources import ParquetSourceSpec

_READ_BUFFER_BYTES = 1 << 20


class StreamingParquetFile(pq.ParquetFile):
    """A ``ParquetFile`` whose ``iter_batches`` keeps the process's memory flat, whatever the file size.

    It reads one row group at a time (batches do not span row groups: pyarrow's reader, crossing a
    boundary, holds both groups' column readers) and hands the Arrow pool's freed pages back to the
    OS between groups (without that, the allocator's retained pages grow the process by ~20 MiB
    over a 4-group file; between groups only, as giving pages back costs faulting them in again).
    Given ``mapping`` (a local file's read-only memory map, which this object reads zero-copy), it
    also drops the mapped pages from the process after every batch
    (``MADV_DONTNEED``: they stay in the page cache, a later access faults them back in), so the
    file's pages do not pile up in RSS until the file is closed.

    Example::

        with open_parquet("/data/part-0.parquet") as parquet:
            rows = sum(b.num_rows for b in parquet.iter_batches(65536, columns=["click"]))
    """

    def __init__(self, source: pa.NativeFile, mapping: mmap.mmap | None = None, **options: Any):
        super().__init__(source, **options)
        self._mapping = mapping

    def iter_batches(
        self,
        batch_size: int = 65536,
        row_groups: Iterable[int] | None = None,
        columns: list[str] | None = None,
        use_threads: bool = True,
        use_pandas_metadata: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        groups = list(range(self.num_row_groups) if row_groups is None else row_groups)
        for i, group in enumerate(groups):
            if i:  # between two groups only: a one-group file (or task) pays no page faults for it
                pa.default_memory_pool().release_unused()
            for batch in super().iter_batches(batch_size, [group], columns, use_threads, use_pandas_metadata):
                self._drop_mapped_pages()
                yield batch

    def _drop_mapped_pages(self) -> None:
        if self._mapping is not None and not self._mapping.closed:
            self._mapping.madvise(mmap.MADV_DONTNEED)

    def close(self, force: bool = False) -> None:
        super().close(force)
        self._drop_mapped_pages()  # the mapping itself goes when the last batch referring to it does


def open_parquet(source: str | pa.NativeFile) -> pq.ParquetFile:
    """Open a Parquet file for streaming reads with flat memory (see ``StreamingParquetFile``).

    A local path is memory-mapped and read zero-copy (no copies through read buffers), one of at most
    1 MiB is read into memory at once; any other file is read through a 1 MiB buffered stream. Neither pre-buffers whole row groups, so memory
    follows the batch, not the (often 100 MB+) row group, nor the file.
    """
    if not isinstance(source, str):
        return StreamingParquetFile(source, buffer_size=_READ_BUFFER_BYTES, pre_buffer=False)
    with open(source, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:  # mmap refuses empty files; let pyarrow say what is wrong
            return pq.ParquetFile(source, pre_buffer=False)
        if size <= _READ_BUFFER_BYTES:  # a small file is read at once: cheaper than mapping it (a pack's files)
            return StreamingParquetFile(pa.BufferReader(handle.read()), pre_buffer=False)
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    return StreamingParquetFile(pa.BufferReader(pa.py_buffer(mapping)), mapping, pre_buffer=False)


def partition_dir(spec: ParquetSourceSpec, start: datetime) -> str:
    """Directory of the partition starting at ``start``, relative to the source root."""
    if spec.layout == "hive":
        day = f"dt={start:%Y-%m-%d}"
        return day if spec.granularity == "day" else f"{day}/hour={start:%H}"
    assert spec.template is not None
    return spec.template.format(YYYY=f"{start:%Y}", MM=f"{start:%m}", DD=f"{start:%d}", HH=f"{start:%H}")


def _is_data_name(entry: dict[str, Any]) -> bool:
    name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
    return not name.startswith(("_", ".")) and not name.endswith(".crc")


def _followed(entry: dict[str, Any], source: str) -> dict[str, Any]:
    """A local symlink's listing entry (fsspec: type ``other``) as its target's: a file link lists as a file."""
    try:
        stat = os.stat(entry["name"])
    except FileNotFoundError as exc:
        target = entry.get("destination")
        raise FileNotFoundError(f"source {source!r}: broken symlink {entry['name']} -> {target}") from exc
    return {**entry, "type": "file" if S_ISREG(stat.st_mode) else "other", "size": stat.st_size}


def _arrow_fs(fs: fsspec.AbstractFileSystem) -> pafs.FileSystem:
    # pyarrow's own local filesystem reads several times faster than a Python file object.
    if isinstance(fs, LocalFileSystem):
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


class ParquetSource(SourceAdapter):
    """Adapter for hive-style or templated Parquet directories (see module docstring)."""

    spec: ParquetSourceSpec

    def __init__(self, spec: ParquetSourceSpec, context: SourceContext):
        super().__init__(spec, context)
        self.root = context.resolve(spec.path).rstrip("/")
        self.fs, self._root_path = fsspec.core.url_to_fs(self.root, **spec.storage_options)
        self._guard = context.guard(spec.name, spec.path)
        self.arrow_fs = _arrow_fs(self.fs)
        self.columns = native_columns(spec.columns)

    def project(self, fields: Iterable[str] | None, constants: bool = True) -> ParquetSource:
        super().project(fields, constants)
        self.columns = native_columns(self.spec.columns, self.normalize.fields)  # decode no other column
        return self

    def _list_dir(self, path: str) -> list[dict[str, Any]] | None:
        try:
            return self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return None

    def _data_files(self, entries: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The data files among ``entries``; each (and its directory) must stay inside the root, symlinks
        resolved (:class:`PathOutsideRootError` otherwise); a symlink inside it is read as its target."""
        for entry in entries:
            if not _is_data_name(entry) or (entry.get("type") != "file" and not entry.get("islink")):
                continue
            self._guard.check(entry["name"])
            if entry.get("islink"):
                entry = _followed(entry, self.spec.name)
            if entry.get("type") == "file":
                yield entry

    def _listing(self, start: datetime) -> Partition:
        step = granularity_step(self.spec.granularity)
        rel = partition_dir(self.spec, start)
        path = f"{self._root_path}/{rel}"
        listed = functools.partial(Partition, source=self.spec.name, start=start, end=start + step, location=path)
        entries = self._list_dir(path)
        if entries is None:
            return listed(ready=False, reason=f"directory {path} does not exist")
        files = sorted(self._data_files(entries), key=lambda e: e["name"])
        names = {e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries}
        marker = self.spec.success_marker
        ready, reason = True, None
        if marker and marker not in names:
            ready, reason = False, f"no {marker} marker in {path}"
        return listed(
            ready=ready,
            reason=reason,
            files=len(files),
            bytes=sum(int(e.get("size") or 0) for e in files),
            detail={"files": [(e["name"], int(e.get("size") or 0)) for e in files]},
        )

    def partitions(self, window: TimeWindow) -> list[Partition]:
        return [self._listing(start) for start in window.partition_starts(self.spec.granularity)]

    def split(self, partition: Partition) -> list[ReadTask]:
        tasks: list[ReadTask] = []
        for name, size in partition.detail.get("files", []):
            if not self.spec.split_row_groups or size <= self.spec.target_task_bytes:
                tasks.append(ReadTask(self.spec.name, partition.start, name, size_bytes=size))
                continue
            tasks += self._row_group_tasks(partition.start, name)
        return tasks

    def _row_group_tasks(self, start: datetime, name: str) -> list[ReadTask]:
        try:
            meta = pq.read_metadata(name, filesystem=self.arrow_fs)
        except (OSError, pa.ArrowException) as exc:
            raise SourceReadError(name, f"cannot read Parquet footer: {exc}") from exc
        tasks, first, size, rows = [], 0, 0, 0
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            size += group.total_byte_size
            rows += group.num_rows
            if size >= self.spec.target_task_bytes or i == meta.num_row_groups - 1:
                tasks.append(ReadTask(self.spec.name, start, name, first, i + 1, size, rows))
                first, size, rows = i + 1, 0, 0
        return tasks

    def open_file(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """The native batches of one file task (its row-group range), the projected columns only; opening
        and the column check happen now (:class:`SourceReadError`, :class:`SchemaMismatchError`)."""
        try:
            local = isinstance(self.arrow_fs, pafs.LocalFileSystem)
            handle = None if local else self.arrow_fs.open_input_file(task.uri)
            parquet = open_parquet(task.uri if handle is None else handle)
            names = set(parquet.schema_arrow.names)  # (schema_arrow builds a new schema per call)
            missing = [c for c in self.columns if c not in names]
            groups = list(range(task.start, task.stop)) if task.stop is not None else None
            # One thread per task: data executors parallelise across tasks (cheaper per core).
            batches = parquet.iter_batches(
                batch_size=self.spec.batch_rows, row_groups=groups, columns=self.columns, use_threads=False
            )
        except (OSError, pa.ArrowException) as exc:
            raise SourceReadError(task.uri, f"not a readable Parquet file: {exc}") from exc
        if missing:
            parquet.close()
            raise SchemaMismatchError(f"{task.uri}: columns {missing} are missing (have {parquet.schema_arrow.names})")
        return self._decoded(task.uri, parquet, batches)

    @staticmethod
    def _decoded(uri: str, parquet: pq.ParquetFile, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with parquet:
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                except (OSError, pa.ArrowException) as exc:
                    raise SourceReadError(uri, f"corrupt Parquet data: {exc}") from exc
                yield batch

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        return self.read_files(task)

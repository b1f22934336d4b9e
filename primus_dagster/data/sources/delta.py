"""Delta Lake source: partitions from the transaction log, tasks per data file, pinned versions.

The table is read with ``deltalake`` (no Dagster IO manager): the add actions of the table's
current version list the files of each ``date_column`` (and ``hour_column``) partition; each
file becomes one :class:`ReadTask` carrying that version, and is streamed with pyarrow.
Data files are immutable, so a task reads exactly what its version listed even after later
appends or compactions (until the files are vacuumed).

Example::

    spec = DeltaSourceSpec(name="imp", type="delta", uri="delta/impressions",
                           columns={"ts": "event_time", "label": "click", "dense": ["d0"]})
    with DeltaSource(spec, SourceContext(data_root="/data")) as source:
        for part in source.ready_partitions(TimeWindow.hours_from(start, 24)):
            for task in source.split(part):
                for batch in source.read(task):
                    ...
"""

from __future__ import annotations

import datetime as _dt
import json
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from datetime import datetime
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from primus_dagster.data.canonical import native_columns
from primus_dagster.data.sources.base import (
    Partition,
    ReadTask,
    SourceAdapter,
    SourceContext,
    SourceReadError,
    TimeWindow,
)
from primus_dagster.data.sources.parquet import open_parquet
from primus_dagster.spec.dataset import granularity_step
from primus_dagster.spec.sources import DeltaSourceSpec

# Reader features that do not change how a data file maps onto the table's rows and columns,
# so reading the listed files one by one with plain Parquet is correct.
HANDLED_READER_FEATURES = frozenset(
    {
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "variantType",
        "variantType-preview",
        "typeWidening",
        "typeWidening-preview",
    }
)
_MAX_CACHED_PARTITIONS = 4096


class DeltaTableNotFoundError(FileNotFoundError):
    """There is no Delta table at the source's URI."""


class UnsupportedDeltaFeatureError(RuntimeError):
    """The table needs a reader feature (deletion vectors, column mapping, ...) not handled here."""


class DeltaLogError(RuntimeError):
    """delta-rs could not load the table's transaction log; the message names the broken log entry when
    one of the ``_delta_log/*.json`` files does not parse, else the log folder."""


_MAX_LOG_ENTRIES_CHECKED = 10_000


def broken_log_entry(log_files: list[tuple[str, bytes]]) -> str | None:
    """The first entry of ``log_files`` (name, content) holding a line that is not one JSON object:
    ``"<name> line <n>: <why>"``; None when every line parses.

    >>> broken_log_entry([("00000000000000000001.json", b'{"add": {"path": ')])
    '00000000000000000001.json line 1: not valid JSON (Expecting value at column 18)'
    """
    for name, data in log_files:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"{name}: not UTF-8 ({exc.reason} at byte {exc.start})"
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                action = json.loads(line)
            except json.JSONDecodeError as exc:
                return f"{name} line {number}: not valid JSON ({exc.msg} at column {exc.colno})"
            if not isinstance(action, dict):
                return f"{name} line {number}: not a JSON object (a {type(action).__name__})"
    return None


def check_reader_protocol(
    uri: str,
    min_reader_version: int,
    reader_features: list[str] | None,
    configuration: Mapping[str, str | None] | None = None,
) -> None:
    """Raise :class:`UnsupportedDeltaFeatureError` if a file-by-file reader would misread the table."""
    unsupported = sorted(set(reader_features or ()) - HANDLED_READER_FEATURES)
    mode = (configuration or {}).get("delta.columnMapping.mode")
    if mode and mode != "none" and "columnMapping" not in unsupported:
        unsupported.append("columnMapping")
    if min_reader_version > 3:
        unsupported.append(f"minReaderVersion={min_reader_version}")
    if unsupported:
        raise UnsupportedDeltaFeatureError(
            f"{uri}: the Delta table needs reader feature(s) {', '.join(unsupported)}, which the primus "
            f"Delta reader does not handle (it reads data files directly: deletionVectors would return "
            f"deleted rows, columnMapping would miss renamed columns). Rewrite the table without them, "
            f"or use a Parquet/Iceberg source; handled features: {sorted(HANDLED_READER_FEATURES)}"
        )


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def _local_path(uri: str) -> str:
    return unquote(urlparse(uri).path) if uri.startswith("file://") else uri


class DeltaSource(SourceAdapter):
    """Adapter for a Delta Lake table partitioned by ``date_column`` (+ ``hour_column``).

    Example::

        source = DeltaSource(spec, SourceContext(data_root="/data"))
        part = source.partition(datetime(2024, 1, 1, 5, tzinfo=timezone.utc))
        print(part.ready, part.version, part.files, part.rows)
        batches = [b for t in source.split(part) for b in source.read(t)]
    """

    spec: DeltaSourceSpec

    def __init__(self, spec: DeltaSourceSpec, context: SourceContext):
        super().__init__(spec, context)
        self.uri = context.resolve(spec.uri)
        self._guard = context.guard(spec.name, spec.uri)
        self._table: DeltaTable | None = None
        self._tasks: OrderedDict[tuple[str, datetime], list[ReadTask]] = OrderedDict()
        self._schemas: dict[str, pa.Schema] = {}
        self._remote_fs: pafs.FileSystem | None = None

    # ---- table loading -------------------------------------------------------------
    def _log_files(self) -> tuple[str, list[tuple[str, bytes]]]:
        """The log folder and its JSON commit files (name, content), newest first (the error path only)."""
        root = self.uri.rstrip("/")
        if _is_local(root):
            folder = f"{_local_path(root)}/_delta_log"
            fs: pafs.FileSystem = pafs.LocalFileSystem()
            prefix = folder
        else:
            from deltalake.fs import DeltaStorageHandler

            fs = pafs.PyFileSystem(DeltaStorageHandler(root, self.spec.storage_options or None))
            folder, prefix = f"{root}/_delta_log", "_delta_log"
        infos = fs.get_file_info(pafs.FileSelector(prefix, allow_not_found=True))
        names = sorted((i.path for i in infos if i.path.endswith(".json")), reverse=True)
        out = []
        for path in names[:_MAX_LOG_ENTRIES_CHECKED]:
            with fs.open_input_stream(path) as stream:
                out.append((path.rsplit("/", 1)[-1], stream.read()))
        return folder, out

    def _log_error(self, exc: Exception) -> DeltaLogError:
        """delta-rs's ``exc`` with the broken log entry named (or the log folder, when none is found)."""
        where = f"Delta table {self.uri!r} (source {self.spec.name!r})"
        try:
            folder, files = self._log_files()
            broken = broken_log_entry(files)
        except Exception as inspect_exc:  # the log cannot be listed either: say so beside delta-rs's error
            return DeltaLogError(f"{where}: cannot load the table, nor list its log ({inspect_exc}); delta-rs: {exc}")
        if broken is not None:
            return DeltaLogError(f"{where}: corrupt transaction log entry {folder}/{broken}; delta-rs: {exc}")
        newest = f", newest entry {folder}/{files[0][0]}" if files else ""
        return DeltaLogError(
            f"{where}: cannot load the table; its transaction log {folder} ({len(files)} JSON entries{newest}) "
            f"parses line by line as JSON objects; delta-rs: {exc}"
        )

    def _open_table(self, version: int | None = None) -> DeltaTable:
        self._guard.check(self.uri.rstrip("/"))  # the table (its log) may not lie behind a symlink out of the root
        try:
            table = DeltaTable(self.uri, version=version, storage_options=self.spec.storage_options or None)
        except TableNotFoundError as exc:
            raise DeltaTableNotFoundError(f"no Delta table at {self.uri!r} (source {self.spec.name!r}): {exc}") from exc
        except DeltaError as exc:
            raise self._log_error(exc) from exc
        protocol = table.protocol()
        check_reader_protocol(
            self.uri, protocol.min_reader_version, protocol.reader_features, table.metadata().configuration
        )
        return table

    def table(self, refresh: bool = True) -> DeltaTable:
        """The cached table, brought up to the latest version when ``refresh``."""
        if self._table is None:
            self._table = self._open_table()
        elif refresh:
            try:
                self._table.update_incremental()
            except TableNotFoundError:
                raise
            except DeltaError as exc:
                raise self._log_error(exc) from exc
            protocol = self._table.protocol()
            check_reader_protocol(
                self.uri, protocol.min_reader_version, protocol.reader_features, self._table.metadata().configuration
            )
        return self._table

    def version(self) -> str | None:
        return str(self.table(refresh=True).version())

    # ---- listing ---------------------------------------------------------------------
    def _key(self, start: datetime) -> tuple[str, int | None]:
        hour = start.hour if self.spec.granularity == "hour" else None
        return start.date().isoformat(), hour

    def _list_files(self, table: DeltaTable, starts: list[datetime]) -> dict[datetime, list[ReadTask]]:
        """Read tasks of each partition start, from the add actions of ``table``'s version."""
        version = str(table.version())
        actions = pa.table(table.get_add_actions(flatten=True))
        date_col = f"partition.{self.spec.date_column}"
        hour_col = f"partition.{self.spec.hour_column}" if self.spec.granularity == "hour" else None
        for col, name in ((date_col, self.spec.date_column), (hour_col, self.spec.hour_column)):
            if col is not None and col not in actions.column_names and actions.num_rows:
                have = [c[len("partition.") :] for c in actions.column_names if c.startswith("partition.")]
                raise ValueError(
                    f"{self.uri}: Delta table is not partitioned by {name!r} "
                    f"(partition columns: {have}); set date_column/hour_column in the source spec"
                )
        by_key = {self._key(s): s for s in starts}
        out: dict[datetime, list[ReadTask]] = {s: [] for s in starts}
        if not actions.num_rows:
            return out
        root = table.table_uri
        dates = actions.column(date_col).to_pylist()
        hours = actions.column(hour_col).to_pylist() if hour_col else [None] * actions.num_rows
        paths = actions.column("path").to_pylist()
        sizes = actions.column("size_bytes").to_pylist()
        records = actions.column("num_records").to_pylist()
        for date, hour, path, size, rows in zip(dates, hours, paths, sizes, records, strict=True):
            if date is None:
                continue
            date_text = date.isoformat() if isinstance(date, _dt.date) else str(date)
            start = by_key.get((date_text, None if hour is None else int(hour)))
            if start is None:
                continue
            uri = self._file_uri(root, path)
            self._guard.check(uri)  # log paths may be absolute, climb with `..`, or be symlinks out of the root
            out[start].append(
                ReadTask(
                    source=self.spec.name,
                    partition=start,
                    uri=uri,
                    size_bytes=int(size),
                    rows=rows,
                    version=version,
                )
            )
        for tasks in out.values():
            tasks.sort(key=lambda t: t.uri)
        return out

    def _file_uri(self, root: str, path: str) -> str:
        if "://" in path:  # absolute URI in the log (e.g. shallow clones)
            return _local_path(path) if path.startswith("file://") else path
        rel = unquote(path)  # log paths are URL-encoded once
        if root.startswith("file://"):
            return f"{_local_path(root).rstrip('/')}/{rel}"
        return f"{root.rstrip('/')}/{rel}"

    def _remember(self, version: str, tasks: dict[datetime, list[ReadTask]]) -> None:
        for start, items in tasks.items():
            self._tasks[(version, start)] = items
            self._tasks.move_to_end((version, start))
        while len(self._tasks) > _MAX_CACHED_PARTITIONS:
            self._tasks.popitem(last=False)

    def partitions(self, window: TimeWindow) -> list[Partition]:
        table = self.table(refresh=True)
        version = str(table.version())
        step = granularity_step(self.spec.granularity)
        starts = window.partition_starts(self.spec.granularity)
        listed = self._list_files(table, starts)
        self._remember(version, listed)
        out = []
        for start in starts:
            tasks = listed[start]
            date, hour = self._key(start)
            where = f"{self.spec.date_column}={date}" + (f"/{self.spec.hour_column}={hour}" if hour is not None else "")
            rows = None if any(t.rows is None for t in tasks) else sum(t.rows or 0 for t in tasks)
            out.append(
                Partition(
                    source=self.spec.name,
                    start=start,
                    end=start + step,
                    ready=bool(tasks),
                    location=f"{self.uri.rstrip('/')}/{where}",
                    version=version,
                    files=len(tasks),
                    bytes=sum(t.size_bytes for t in tasks),
                    rows=rows,
                    reason=None if tasks else f"no committed files for {where} at table version {version}",
                    detail={"table_version": int(version), "partition_values": where},
                )
            )
        return out

    def split(self, partition: Partition) -> list[ReadTask]:
        if not partition.ready:  # nothing committed there (as ParquetSource: no tasks)
            return []
        cached = self._tasks.get((partition.version or "", partition.start))
        if cached is not None:
            return list(cached)
        table = self.table(refresh=True) if partition.version is None else self._open_table(int(partition.version))
        listed = self._list_files(table, [partition.start])
        self._remember(str(table.version()), listed)
        return list(listed[partition.start])

    # ---- reading ---------------------------------------------------------------------
    def _open_file(self, uri: str) -> pq.ParquetFile:
        if _is_local(uri):
            return open_parquet(_local_path(uri))
        root = self.table(refresh=False).table_uri.rstrip("/")
        if uri.startswith(root + "/"):
            if self._remote_fs is None:
                from deltalake.fs import DeltaStorageHandler

                self._remote_fs = pafs.PyFileSystem(DeltaStorageHandler(root, self.spec.storage_options or None))
            return open_parquet(self._remote_fs.open_input_file(uri[len(root) + 1 :]))
        filesystem, path = pafs.FileSystem.from_uri(uri)
        return open_parquet(filesystem.open_input_file(path))

    def _table_schema(self, version: str | None) -> pa.Schema:
        key = version or ""
        if key not in self._schemas:
            table = self._open_table(int(version)) if version is not None else self.table(refresh=False)
            self._schemas[key] = pa.schema(table.schema().to_arrow())
        return self._schemas[key]

    def _fill_missing(self, batch: pa.RecordBatch, missing: list[str], schema: pa.Schema) -> pa.RecordBatch:
        """Columns added to the table after this file was written read as nulls (Delta semantics)."""
        for name in missing:
            batch = batch.append_column(schema.field(name), pa.nulls(batch.num_rows, schema.field(name).type))
        return batch

    def open_file(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        """The native batches of one data file (columns added to the table after it was written read as
        nulls); opening it happens now (:class:`SourceReadError`)."""
        columns = native_columns(self.spec.columns, self.normalize.fields)
        where = f"table version {task.version}" if task.version is not None else "Delta data file"
        try:
            parquet = self._open_file(task.uri)
            present = set(parquet.schema_arrow.names)
        except Exception as exc:  # any failure to open is this file's failure
            hint = " (vacuumed after listing?)" if isinstance(exc, FileNotFoundError) else ""
            raise SourceReadError(task.uri, f"cannot open Parquet data file of {where}{hint}: {exc}") from exc
        missing = [c for c in columns if c not in present]
        fill: list[str] = []
        if missing:
            schema = self._table_schema(task.version)
            fill = [c for c in missing if schema.get_field_index(c) >= 0]
        batches = parquet.iter_batches(
            batch_size=self.spec.batch_rows, columns=[c for c in columns if c in present], use_threads=False
        )
        return self._decoded(task, where, batches, fill)

    def _decoded(
        self, task: ReadTask, where: str, batches: Iterator[pa.RecordBatch], fill: list[str]
    ) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except Exception as exc:  # decoding errors name the file
                raise SourceReadError(task.uri, f"cannot read Parquet data file of {where}: {exc}") from exc
            if fill:
                batch = self._fill_missing(batch, fill, self._table_schema(task.version))
            yield batch

    def read(self, task: ReadTask) -> Iterator[pa.RecordBatch]:
        return self.read_files(task)

    def close(self) -> None:
        self._table = None
        self._tasks.clear()
        self._schemas.clear()
        self._remote_fs = None
